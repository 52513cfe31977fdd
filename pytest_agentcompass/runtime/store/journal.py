"""The details journal: one detail record per line of ``details/journal.jsonl``, appended; a task's last line wins.

Written by every process of a session at once (xdist workers): each record
goes out in one ``write`` on a descriptor opened with ``O_APPEND``, under the
journal's ``flock``, which a local file system (ext4, xfs, btrfs, tmpfs)
applies whole, at the file's end, so two records never interleave. Not on
NFS, where appends are not atomic: keep such a run in the ``files`` layout.

Readers keep an index, task id to the place of its last line, and read only
what was appended since they last looked: an xdist worker asking about each
task it is handed reads the journal once in all, not once per task. A line
whose task cannot be told (garbage, or cut short at its start) is skipped; a
line cut short by a kill is the task's last line and does not parse, so the
task reads as not done, as a detail file cut short does (so does a line still
being written, until it ends). After a write the disk refused, the task's
earlier record is made unreadable in place, for the same reason (best effort:
see :meth:`Journal._overrule`).

At the run's end its owner compacts the journal (:meth:`Journal.compact`):
each task's last whole line, so that a finished or interrupted run's journal
is plain JSON Lines, one line per task, whatever kills and reruns left in it.

One case reads differently from detail files: a rerun's record cut short by a
kill within its first few dozen bytes (before its task id is whole) belongs to
no task, so the task's earlier record stands, where a detail file would read
as not done. A kill cuts a write at a page boundary, so this takes a kill
during the rewrite of a record whose head straddles one.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os

__all__ = ["JOURNAL", "Journal", "journal_line", "place_in_journal"]

#: The journal's name inside ``details/``: it does not end in ``.json``, so no task's detail file is it.
JOURNAL = "journal.jsonl"

_APPEND = os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC  # read: the last byte, is the last line ended?
#: Bytes of the journal read at a time: an index of 100,000 tasks never holds their whole journal.
_CHUNK = 2**20
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
    """One run directory's journal: appends records, finds a task's last one.

    Each reader (a store, the aggregate's read-back) keeps its own: the index
    is only as good as the file it was read from, and no other thread touches it.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._at: dict[str, tuple[int, int]] = {}  # task id -> (offset, length) of its last line
        self._read_to = 0  # the index covers the journal's whole lines up to here
        self._seen = (-1, -1, -1)  # (inode, size, mtime) at the last look: unchanged, nothing to read
        self._head = b""  # the file's first bytes: another file at the path begins otherwise
        self._lines = 0
        self._open: set[str] = set()

    # -- writing -------------------------------------------------------
    def append(self, task_id: str, text: str) -> None:
        """Append ``text`` (one JSON record, no newline in it) as the detail of ``task_id``.

        Under the journal's ``flock``, a line left open (its writer was killed
        mid-write: a kill cuts a write short, and frees the lock) is ended
        first, so that the record stands alone whoever left that line. Checking
        the last byte and writing are one step for every writer of the journal.
        """
        data = text.encode("utf-8") + b"\n"
        fd = self._locked()
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                data = b"\n" + data
            try:
                written = os.write(fd, data)
            except OSError:
                self._overrule(task_id)
                raise
            if written != len(data):  # a full disk: part of it went out
                self._overrule(task_id)
                raise OSError(f"{self.path}: the disk took only part of the detail of {task_id!r}")
        finally:
            os.close(fd)  # and with it the lock

    def _locked(self) -> int:
        """The journal opened for appending, holding its ``flock``: the file at the path once it is held
        (:meth:`compact` may have put another in its place while this process waited)."""
        while True:
            fd = os.open(self.path, _APPEND, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                if os.fstat(fd).st_ino == os.stat(self.path).st_ino:
                    return fd
            except FileNotFoundError:
                pass  # replaced and not yet in place: open it again
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)

    def compact(self) -> bool:
        """Rewrite the journal as each task's last line, in order, when it holds anything else.

        Called by the run's owner at the run's end, when no other process
        writes. What a reader finds does not change: a task whose last line is
        no whole record (cut short by a kill: it does not end its object)
        keeps no line, and reads as not done either way; lines superseded by a
        later one, lines of no task and empty lines go. Written through a
        temporary name under the journal's lock, so a reader sees the old file
        or the new one; read and written a chunk or a line at a time, so that
        memory does not grow with the run. Returns whether it was rewritten.
        """
        if not os.path.exists(self.path):
            return False
        fd = self._locked()
        try:
            self._forget()
            size = self._read_from(fd)
            # A task whose last line is cut short (in the middle, or the unended last one) keeps none.
            whole = {
                task_id: where
                for task_id, where in self._at.items()
                if task_id not in self._open and where[0] < self._read_to
            }
            if self._read_to == size and self._lines == len(self._at) == len(whole):
                return False  # one whole line per task already: nothing to drop
            # Named as a writer's temporary file (``.<name>.<...>.tmp``): a resume removes one a kill left.
            tmp = f"{os.path.dirname(self.path)}/.{JOURNAL}.{os.getpid()}-compact.tmp"
            try:
                with open(tmp, "wb") as out:
                    for offset, length in sorted(whole.values()):
                        out.write(os.pread(fd, length, offset) + b"\n")
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            return True
        finally:
            self._forget()  # the index of a run that ended is not kept (100,000 tasks: megabytes)
            os.close(fd)

    def _overrule(self, task_id: str) -> None:
        """After a failed append, make the earlier record of ``task_id`` (if it is whole) unreadable.

        A rerun that could not be recorded must not leave the earlier record
        standing for it, as a detail file that could not be written is gone.
        Its last byte is overwritten in place, which needs no new block on a
        file system that writes in place (ext4, xfs). Best effort: a
        copy-on-write file system with no room left refuses that too.
        """
        with contextlib.suppress(OSError):
            found = self._line_of(task_id)
            if found is None or found[0][1] < 2:
                return
            where = found[0]
            fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)  # without O_APPEND: Linux appends any pwrite there
            try:
                if os.pread(fd, 1, where[0] + where[1] - 1) == b"}":
                    os.pwrite(fd, b"#", where[0] + where[1] - 1)
            finally:
                os.close(fd)

    # -- reading -------------------------------------------------------
    def _forget(self) -> None:
        self._at, self._read_to, self._seen, self._head = {}, 0, (-1, -1, -1), b""
        self._lines = 0  # line ends read, empty lines and lines of no task included
        self._open = set()  # tasks whose last whole line is no whole record (it ends no object)

    def _catch_up(self) -> None:
        """Index what was appended since the last look (every line, if the path holds another file now)."""
        try:
            st = os.stat(self.path)
        except OSError:
            self._forget()
            return
        if (st.st_ino, st.st_size, st.st_mtime_ns) == self._seen:
            return
        with open(self.path, "rb") as fh:
            self._read_from(fh.fileno())

    def _read_from(self, fd: int) -> int:
        """Index the journal open at ``fd`` from where the index stopped; returns the size it read to."""
        st = os.fstat(fd)
        # Another file at this path (a run directory made again, whose inode may be the old
        # one's): its first bytes differ, or it is shorter, or the line end the index stopped
        # at is no line end any more. Then every line is read again.
        if (
            st.st_ino != self._seen[0]
            or st.st_size < self._read_to
            or os.pread(fd, len(self._head), 0) != self._head
            or (self._read_to and os.pread(fd, 1, self._read_to - 1) != b"\n")
        ):
            self._forget()
        if not self._head:
            self._head = os.pread(fd, 64, 0)
        rest = b""  # the start of a line the last chunk did not end
        position = self._read_to
        while position < st.st_size:
            chunk = os.pread(fd, min(_CHUNK, st.st_size - position), position)
            if not chunk:  # cut short since the fstat
                break
            position += len(chunk)
            data = rest + chunk
            end = self._index(data)
            rest = data[end:]
        # A line with no end yet is being written, or was cut short by a kill: either way its task
        # is not done now (as a detail file being written is not), and it is read again once it grows.
        task_id = _task_of(rest) if rest else None
        if task_id is not None:
            self._at[task_id] = (self._read_to, len(rest))
        self._seen = (st.st_ino, position, st.st_mtime_ns)
        return position

    def _index(self, data: bytes) -> int:
        """Index the whole lines of ``data`` (the journal from :attr:`_read_to` on); returns their length."""
        end = data.rfind(b"\n") + 1
        start, base, at, unended = 0, self._read_to, self._at, self._open
        while start < end:
            stop = data.index(b"\n", start)
            task_id = _task_of(data[start:stop]) if stop > start else None
            if task_id is not None:
                at[task_id] = (base + start, stop - start)
                if data[stop - 1] == 0x7D:  # "}": the line ends an object
                    unended.discard(task_id)
                else:
                    unended.add(task_id)
            start = stop + 1
        self._lines += data.count(b"\n", 0, end)
        self._read_to = base + end
        return end

    def _line_of(self, task_id: str) -> tuple[tuple[int, int], bytes] | None:
        """Where the last line of ``task_id`` lies, and the line: checked to be that task's."""
        for _ in range(2):
            self._catch_up()
            where = self._at.get(task_id)
            if where is None:
                return None
            with open(self.path, "rb") as fh:
                line = os.pread(fh.fileno(), where[1], where[0])
            if line.startswith(_HEAD + task_id.encode() + b'"') or _task_of(line) == task_id:
                return where, line
            self._forget()  # the index is of another file than the one at the path now: read it again
        return None

    def task_ids(self) -> list[str]:
        self._catch_up()
        return list(self._at)

    def text(self, task_id: str) -> bytes | None:
        """The last line of ``task_id``, without its end; ``None`` when it has none."""
        found = self._line_of(task_id)
        return None if found is None else found[1]


def journal_line(text: bytes) -> bytes:
    """``text`` (a detail as stored, e.g. a detail file's) as a journal keeps it: one line that begins
    with its task id. A compact record this plugin wrote is kept byte for byte; another (made
    readable by hand, its keys reordered) is encoded again, compact, its task id first."""
    if text.startswith(_HEAD) and b"\n" not in text:
        return text
    record = json.loads(text)
    if type(record) is dict and "task_id" in record:
        record = {"task_id": record["task_id"], **record}
    return json.dumps(record, separators=(",", ":")).encode()


def place_in_journal(place: str) -> tuple[str, str] | None:
    """``(journal, task id)`` when ``place`` names a line of a journal (``<...>/journal.jsonl#<task>``)."""
    path, sep, task_id = place.rpartition("#")
    return (path, task_id) if sep and path.endswith("/" + JOURNAL) else None
