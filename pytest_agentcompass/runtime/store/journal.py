"""The details journal: one detail record per line of ``details/journal.jsonl``, appended; a task's last line wins.

Written by every process of a session at once (xdist workers): each record
goes out in one ``write`` on a descriptor opened with ``O_APPEND``, which a
local file system (ext4, xfs, btrfs, tmpfs) applies whole, at the file's end,
so two records never interleave. Not on NFS, where appends are not atomic:
keep such a run in the ``files`` layout.

Readers keep an index, task id to the place of its last line, and read only
what was appended since they last looked: an xdist worker asking about each
task it is handed reads the journal once in all, not once per task. A line
whose task cannot be told (garbage, or cut short at its start) is skipped; a
line cut short by a kill is the task's last line and does not parse, so the
task reads as not done, as a detail file cut short does (so does a line still
being written, until it ends). A write that fails halfway is followed by a
line that names the task with no status a result has, for the same reason.
"""

from __future__ import annotations

import json
import os

__all__ = ["JOURNAL", "Journal", "journal_of", "place_in_journal"]

#: The journal's name inside ``details/``: it does not end in ``.json``, so no task's detail file is it.
JOURNAL = "journal.jsonl"

_APPEND = os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
#: How a record this plugin wrote begins: the task id comes first (``RunResult.to_dict``), and ids are
#: safe names (no quote, no backslash), so the id is read without decoding the line.
_HEAD = b'{"task_id":"'


def _task_of(line: bytes) -> str | None:
    if line.startswith(_HEAD):
        end = line.find(b'"', len(_HEAD))
        return line[len(_HEAD) : end].decode("utf-8", "replace") if end > 0 else None
    try:  # written by hand, or by other code: decoded whole
        record = json.loads(line)
    except ValueError:
        return None
    task_id = record.get("task_id") if type(record) is dict else None
    return task_id if type(task_id) is str else None


class Journal:
    """One run directory's journal: appends records, finds a task's last one."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._at: dict[str, tuple[int, int]] = {}  # task id -> (offset, length) of its last line
        self._read_to = 0  # the index covers the journal up to here
        self._inode = -1

    # -- writing -------------------------------------------------------
    def append(self, task_id: str, text: str) -> None:
        """Append ``text`` (one JSON record, no newline in it) as the detail of ``task_id``."""
        data = (text + "\n").encode("utf-8")
        fd = os.open(self.path, _APPEND, 0o644)
        try:
            # Another process of the session, or a killed one, may have left the last line open: end it
            # first, so ours stands alone. (Asked at every append: a couple of microseconds.)
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                data = b"\n" + data
            try:
                if os.write(fd, data) != len(data):  # a full disk: part of it went out
                    raise OSError(f"{self.path}: the disk took only part of the detail of {task_id!r}")
            except OSError:
                self._unsay(fd, task_id)
                raise
        finally:
            os.close(fd)

    @staticmethod
    def _unsay(fd: int, task_id: str) -> None:
        """After a failed append, a line that makes ``task_id`` read as not done (when the disk takes it)."""
        line = json.dumps({"task_id": task_id, "status": "unwritten"}, separators=(",", ":"))
        try:
            os.write(fd, f"\n{line}\n".encode())
        except OSError:
            pass  # the next append ends the cut line first; the task then reads as its earlier line says

    # -- reading -------------------------------------------------------
    def _catch_up(self) -> None:
        """Index what was appended since the last look (every line, if the file was replaced)."""
        try:
            st = os.stat(self.path)
        except OSError:
            self._at, self._read_to, self._inode = {}, 0, -1
            return
        if st.st_ino != self._inode or st.st_size < self._read_to:
            self._at, self._read_to, self._inode = {}, 0, st.st_ino
        if st.st_size == self._read_to:
            return
        with open(self.path, "rb") as fh:
            fh.seek(self._read_to)
            data = fh.read(st.st_size - self._read_to)
        end = data.rfind(b"\n") + 1
        start, base, at = 0, self._read_to, self._at
        while start < end:
            stop = data.index(b"\n", start)
            task_id = _task_of(data[start:stop]) if stop > start else None
            if task_id is not None:
                at[task_id] = (base + start, stop - start)
            start = stop + 1
        # A line with no end yet is being written, or was cut short by a kill: either way its task
        # is not done now (as a detail file being written is not), and it is read again next time.
        task_id = _task_of(data[end:]) if end < len(data) else None
        if task_id is not None:
            at[task_id] = (base + end, len(data) - end)
        self._read_to = base + end

    def task_ids(self) -> list[str]:
        self._catch_up()
        return list(self._at)

    def holds(self, task_id: str) -> bool:
        self._catch_up()
        return task_id in self._at

    def text(self, task_id: str) -> bytes | None:
        """The last line of ``task_id``, without its end; ``None`` when it has none."""
        self._catch_up()
        for _ in range(2):
            where = self._at.get(task_id)
            if where is None:
                return None
            with open(self.path, "rb") as fh:
                line = os.pread(fh.fileno(), where[1], where[0])
            if _task_of(line) == task_id:
                return line
            self._at, self._read_to, self._inode = {}, 0, -1  # another file at the same path: index it again
            self._catch_up()
        return None


#: The journals this process looked into last, by path: their indexes are kept between readers
#: (the store, the aggregate's read-back, the page), a few at a time.
_journals: dict[str, Journal] = {}
_KEPT = 16


def journal_of(path: str) -> Journal:
    """The journal at ``path``, with what this process already indexed of it."""
    journal = _journals.pop(path, None) or Journal(path)
    _journals[path] = journal  # the newest last
    if len(_journals) > _KEPT:
        del _journals[next(iter(_journals))]
    return journal


def place_in_journal(place: str) -> tuple[str, str] | None:
    """``(journal, task id)`` when ``place`` names a line of a journal (``<...>/journal.jsonl#<task>``)."""
    path, sep, task_id = place.rpartition("#")
    return (path, task_id) if sep and path.endswith("/" + JOURNAL) else None
