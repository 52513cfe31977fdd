"""A run's details: one terminal record per task, the set a run counts, and the only code that knows where they lie.

Two layouts, one per run directory (``execution.details_layout``):

- ``files``, the default and the layout the AgentCompass run directory defines:
  ``details/<task>.json``, one file per task.
- ``journal``: ``details/journal.jsonl``, one record per line, appended; the
  last line of a task is its detail. A run of many quick tasks then creates
  one file instead of one per task, a large share of what the plugin adds to
  a no-op task on an ext4 without a journal (docs/performance.md, set S).

A run keeps the layout it began with: a run directory that already holds
details is read and written in its own layout, whatever the config says now,
so a resume or an xdist worker never mixes the two. Every reader (resume,
carry-over, an xdist worker's check of what the owner recorded, the
controller's finalization, the aggregate's read-back, the page, baselines,
gates, the Ctrl-C report) goes through :class:`DetailFiles` or the functions
below; none opens or lists the folder itself, and the page links a detail at
:meth:`DetailFiles.place`, so where a detail lives is decided here.

A detail is written in place, not through a temporary name (see
``FileWriter._write_in_place``), and a journal line is appended: half a
detail is not JSON, and every reader takes a detail that does not parse, or
parses to something other than a JSON object, for a task not done.

What the run's page shows of each detail is kept as it is written or read
(``page_records``), so the page never reads the run back; an xdist worker
also keeps what it wrote, to send the controller with its last word
(:attr:`DetailFiles.written`, :meth:`DetailFiles.details_sent`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

from ...vocabulary.types import RunStatus
from .journal import JOURNAL, Journal, journal_line, place_in_journal
from .page_records import PageRecords, packed, page_record
from .writing import FileWriter, read_json

__all__ = [
    "DETAILS",
    "JOURNAL",
    "KEEP_WRITTEN_CHARS",
    "DetailFiles",
    "DetailsLayout",
    "detail_place",
    "holds_details",
    "layout_on_disk",
    "read_detail_file",
]

#: The folder of a run directory that holds its details, in either layout.
DETAILS = "details"

#: How a run directory keeps its details (module docstring).
DetailsLayout = Literal["files", "journal"]

#: The most text of details an xdist worker keeps to send the controller (:attr:`DetailFiles.written`):
#: ten thousand ordinary details are a few megabytes, while agent trajectories can make gigabytes,
#: past what one xdist message carries (2 GiB) and twice in memory while it is sent.
KEEP_WRITTEN_CHARS = 64 * 2**20


#: The statuses a record may hold (a result's ``RunStatus``).
_STATUSES = frozenset(RunStatus)


def _parsed(text: bytes | None) -> dict[str, Any] | None:
    """The record a journal line holds (:func:`_record`); ``None`` for no line, or one that does not parse."""
    try:
        return None if text is None else _record(json.loads(text))
    except ValueError:
        return None


def _record(detail: Any) -> dict[str, Any] | None:
    """``detail`` when it is a record this plugin writes: an object with a task id and a status a result has."""
    if type(detail) is not dict or type(detail.get("task_id")) is not str:
        return None
    status = detail.get("status", RunStatus.COMPLETED.value)
    return detail if type(status) is str and status in _STATUSES else None


def read_detail_file(path: str | os.PathLike[str], journals: dict[str, Journal] | None = None) -> dict[str, Any] | None:
    """The record at ``path`` (a detail's place as the store gave it, e.g. an outcome's
    ``detail_path``: a file, or ``<run>/details/journal.jsonl#<task>``); ``None`` when there
    is none, or it is not one.

    A journal is indexed to find the line: a caller reading many places passes
    ``journals``, where the indexes are kept between its calls.

    Not one: cut short by a kill (not JSON), or JSON this plugin never wrote
    (not an object, no task id, a status no result has; edited by hand, or
    forged): every reader then takes the task for not done, and resume or
    carry-over runs it again instead of failing the request.
    """
    in_journal = place_in_journal(os.fspath(path))
    if in_journal is None:
        try:
            return _record(read_json(path))
        except (OSError, ValueError):
            return None
    where, task_id = in_journal
    journals = {} if journals is None else journals
    journal = journals.get(where)
    if journal is None:
        journal = journals[where] = Journal(where)
    try:
        return _parsed(journal.text(task_id))
    except OSError:
        return None


def detail_place(task_id: str, layout: DetailsLayout = "files") -> str:
    """Where the detail of ``task_id`` lies inside its run directory, ``/``-separated (the page's links).

    In a journal that is the journal itself: a browser shows it whole.
    """
    return f"{DETAILS}/{JOURNAL}" if layout == "journal" else f"{DETAILS}/{task_id}.json"


def holds_details(run_dir: str | os.PathLike[str]) -> bool:
    """Whether ``run_dir`` is a run directory that has begun recording tasks (it has a details folder)."""
    return os.path.isdir(os.path.join(run_dir, DETAILS))


def layout_on_disk(run_dir: str | os.PathLike[str]) -> DetailsLayout | None:
    """The layout of the details ``run_dir`` holds; ``None`` when it holds none yet."""
    details = os.path.join(run_dir, DETAILS)
    if os.path.exists(os.path.join(details, JOURNAL)):
        return "journal"
    try:
        with os.scandir(details) as entries:
            if any(e.name.endswith(".json") for e in entries):
                return "files"
    except OSError:  # no details yet
        pass
    return None


class DetailFiles(FileWriter):
    """Writes and reads the details of one run directory (the part of :class:`~.files.RunStore` that does).

    :param layout: The layout this store writes a run directory in that holds no
        details yet; one that holds some keeps its own. Readers leave it out.
    """

    def __init__(self, run_dir: Path, layout: DetailsLayout = "files") -> None:
        super().__init__()
        self.details_dir = run_dir / DETAILS
        self._details = str(self.details_dir)
        self._wanted_layout: DetailsLayout = layout
        #: The journal, once this run directory is known to keep one (:attr:`layout`).
        self._journal: Journal | None = None
        self._layout: DetailsLayout | None = None
        #: What the run's page shows of each detail, by task, packed (``page_records``): kept, not read back.
        self._page: dict[str, bytes] = {}
        #: Whether every detail in ``details/`` went through this store (written, or read by ``iter_details``).
        self._page_complete = False
        #: ``(task id, text, page record)`` of each detail written here, when kept (an xdist
        #: worker's, for the controller: :meth:`details_sent`); ``None`` again once they would
        #: hold more than :data:`KEEP_WRITTEN_CHARS` (the controller then reads ``details/``).
        self.written: list[tuple[str, str, bytes]] | None = None
        self._written_chars = 0

    # -- where ---------------------------------------------------------
    @property
    def layout(self) -> DetailsLayout:
        """This run directory's layout: what it holds, or (holding nothing yet) what this store writes.

        Decided at the first detail read or written, once: the processes of one
        session (xdist) all decide alike, as they see the same folder.
        """
        if self._layout is None:
            self._layout = layout_on_disk(os.path.dirname(self._details)) or self._wanted_layout
            if self._layout == "journal":
                self._journal = Journal(f"{self._details}/{JOURNAL}")
        return self._layout

    @property
    def _in_journal(self) -> Journal | None:
        """The journal, when this run directory keeps its details in one (:attr:`layout`)."""
        return self._journal if self.layout == "journal" else None

    def place(self, task_id: str) -> str:
        """:func:`detail_place` in this run directory's layout."""
        return detail_place(task_id, self.layout)

    def detail_path(self, task_id: str) -> Path:
        return Path(self.detail_file(task_id))

    def detail_file(self, task_id: str) -> str:
        """Where the detail of ``task_id`` lies, as a ``str`` (``Path`` parsing is measurable at 10,000
        tasks): its file, or ``<journal>#<task>``, a place :func:`read_detail_file` reads."""
        if self._in_journal is not None:
            return f"{self._details}/{JOURNAL}#{task_id}"
        return f"{self._details}/{task_id}.json"

    # -- writing -------------------------------------------------------
    def _write_detail(self, task_id: str, text: str, record: Any) -> str:
        """Write ``text``, the encoded ``record`` (redacted and bounded), as the detail of ``task_id``;
        remember what the page shows of it. Returns the detail's place."""
        self._store_text(task_id, text)
        page = self._page[task_id] = packed(page_record(record))
        if self.written is not None:
            self._written_chars += len(text)
            if self._written_chars <= KEEP_WRITTEN_CHARS:
                self.written.append((task_id, text, page))
            else:
                self.written = None
        return self.detail_file(task_id)

    def _store_text(self, task_id: str, text: str) -> None:
        journal = self._in_journal
        if journal is not None:
            self._folder_of(journal.path)
            journal.append(task_id, text)
        else:
            self._write_in_place(self.detail_file(task_id), text)

    def copy_detail(self, source: DetailFiles, task_id: str) -> None:
        """Copy the detail of ``task_id`` from ``source`` byte for byte (``carry_over``; see :meth:`same_detail`),
        into this run's layout whatever ``source``'s is."""
        text = source.detail_text(task_id)
        if text is None:
            raise FileNotFoundError(f"no detail of {task_id!r} in {source.details_dir}")
        if self._in_journal is not None:
            text = journal_line(text)
        self._store_text(task_id, text.decode("utf-8"))

    def compact_details(self) -> bool:
        """At the run's end, by its owner (no other process writes then): a journal keeps each task's
        last line only (:meth:`~.journal.Journal.compact`); detail files stay as they are. Returns
        whether the journal was rewritten."""
        journal = self._in_journal
        return journal is not None and journal.compact()

    # -- reading -------------------------------------------------------
    def detail_ids(self) -> list[str]:
        """The ids of the tasks this run holds a detail of (readable or not), sorted as strings
        (``Path`` sorting was measurable). A writer's temporary name (``.<task>.json.<tag>.tmp``) is none."""
        journal = self._in_journal
        if journal is not None:
            return sorted(journal.task_ids())
        try:
            return sorted(e.name[:-5] for e in os.scandir(self._details) if e.name.endswith(".json"))
        except OSError:  # no details yet
            return []

    def detail_text(self, task_id: str) -> bytes | None:
        """The detail of ``task_id`` as stored, without a line's end; ``None`` when there is none."""
        journal = self._in_journal
        try:
            if journal is not None:
                return journal.text(task_id)
            with open(self.detail_file(task_id), "rb") as fh:
                return fh.read().rstrip(b"\n")
        except OSError:  # none, or the run directory gone meanwhile
            return None

    def read_detail(self, task_id: str) -> dict[str, Any] | None:
        """The detail record of ``task_id``; ``None`` when there is none, or it is not one (cut short by a kill)."""
        if self._in_journal is not None:
            return _parsed(self.detail_text(task_id))
        return read_detail_file(self.detail_file(task_id))

    def has_detail(self, task_id: str) -> bool:
        """Whether ``task_id`` has a readable detail here (a task that ended and is counted from it)."""
        return self.read_detail(task_id) is not None

    def same_detail(self, other: DetailFiles, task_id: str) -> bool:
        """Whether the detail of ``task_id`` here is ``other``'s copied by ``carry_over`` (:meth:`copy_detail`):
        byte for byte, or as a journal line made of it."""
        mine, theirs = self.detail_text(task_id), other.detail_text(task_id)
        if mine is None or theirs is None:
            return False
        if mine == theirs:
            return True
        if self._in_journal is None:
            return False
        try:
            return mine == journal_line(theirs)
        except ValueError:
            return False

    def iter_details(self) -> Iterator[dict[str, Any]]:
        """Every readable detail record, by task id.

        Each is remembered for the run's page (:meth:`page_records`) as it is read.
        """
        self._page = {}  # what details/ holds now: a detail removed since (its rewrite failed) shows no more
        for task_id in self.detail_ids():  # none yet: every one to come is written here
            detail = self._read_detail(task_id)
            if detail is not None:
                yield detail
        self._page_complete = True

    def _read_detail(self, task_id: str) -> dict[str, Any] | None:
        """:meth:`read_detail`, remembered for the run's page when it is a record."""
        detail = self.read_detail(task_id)
        if detail is not None:
            self._page[task_id] = packed(page_record(detail))
        return detail

    def details_sent(self, sent: Iterable[tuple[str, str, bytes]], wanted: Iterable[str]) -> Iterator[dict[str, Any]]:
        """The details other processes wrote here, from what they ``sent`` (their :attr:`written`),
        then, read alone, the detail of each ``wanted`` task none of them sent (a task not done has none).

        The records :meth:`iter_details` would read, without a file opened for
        what was sent; the page keeps the record the writing process made of each.
        """
        seen = set()
        for task_id, text, page in sent:
            self._page[task_id] = page
            seen.add(task_id)
            yield json.loads(text)  # written by json.dumps in that process
        for task_id in sorted(set(wanted) - seen):
            detail = self._read_detail(task_id)
            if detail is None:
                self._page.pop(task_id, None)  # gone since the run opened (a rewrite that failed)
                continue
            yield detail

    # -- the page ------------------------------------------------------
    def page_records(self) -> PageRecords | None:
        """What the run's page shows of every detail in ``details/``, from memory (``page_records``).

        ``None`` when some detail there never went through this store (its
        directory was not scanned by :meth:`iter_details` first), or once
        :meth:`forget_page_records` ran: the page then reads the files.
        """
        return PageRecords(self._page) if self._page_complete else None

    def forget_page_records(self) -> None:
        """Release the page records once the run's page is written (a page written later reads the files)."""
        self._page = {}
        self._page_complete = False
