"""A run's details: one terminal record per task, the set a run counts, and the only code that knows where they lie.

``details/<task>.json``, the layout the AgentCompass run directory defines.
Every reader (resume, carry-over, an xdist worker's check of what the owner
recorded, the controller's finalization, the aggregate's read-back, the page,
baselines, gates, the Ctrl-C report) goes through :class:`DetailFiles` or the
functions below; none opens or lists the folder itself, and the page links a
detail at :func:`detail_place`, so where a detail lives is decided here.

A detail is written in place, not through a temporary name (see
``FileWriter._write_in_place``): half a detail is not JSON, and every reader
takes a detail that does not parse, or parses to something other than a JSON
object, for a task not done.

What the run's page shows of each detail is kept as it is written or read
(``page_records``), so the page never reads the run back; an xdist worker
also keeps what it wrote, to send the controller with its last word
(:attr:`DetailFiles.written`, :meth:`DetailFiles.details_sent`).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ...vocabulary.types import RunStatus
from .page_records import PageRecords, packed, page_record
from .writing import FileWriter, read_json

__all__ = ["DETAILS", "KEEP_WRITTEN_CHARS", "DetailFiles", "detail_place", "holds_details", "read_detail_file"]

#: The folder of a run directory that holds one detail record per task.
DETAILS = "details"

#: The most text of details an xdist worker keeps to send the controller (:attr:`DetailFiles.written`):
#: ten thousand ordinary details are a few megabytes, while agent trajectories can make gigabytes,
#: past what one xdist message carries (2 GiB) and twice in memory while it is sent.
KEEP_WRITTEN_CHARS = 64 * 2**20


#: The statuses a record may hold (a result's ``RunStatus``).
_STATUSES = frozenset(RunStatus)


def read_detail_file(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The record in the detail file at ``path`` (a detail's place as the store gave it, e.g. an
    outcome's ``detail_path``); ``None`` when there is none, or it is not one.

    Not one: cut short by a kill (not JSON), or JSON this plugin never wrote
    (not an object, no task id, a status no result has; edited by hand, or
    forged): every reader then takes the task for not done, and resume or
    carry-over runs it again instead of failing the request.
    """
    try:
        detail = read_json(path)
    except (OSError, ValueError):
        return None
    if type(detail) is not dict or type(detail.get("task_id")) is not str:
        return None
    status = detail.get("status", RunStatus.COMPLETED.value)
    return detail if type(status) is str and status in _STATUSES else None


def detail_place(task_id: str) -> str:
    """Where the detail of ``task_id`` lies inside its run directory, ``/``-separated (the page's links)."""
    return f"{DETAILS}/{task_id}.json"


def holds_details(run_dir: str | os.PathLike[str]) -> bool:
    """Whether ``run_dir`` is a run directory that has begun recording tasks (it has a details folder)."""
    return os.path.isdir(os.path.join(run_dir, DETAILS))


class DetailFiles(FileWriter):
    """Writes and reads the details of one run directory (the part of :class:`~.files.RunStore` that does)."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__()
        self.details_dir = run_dir / DETAILS
        self._details = str(self.details_dir)
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
    def detail_path(self, task_id: str) -> Path:
        return Path(self.detail_file(task_id))

    def detail_file(self, task_id: str) -> str:
        """:meth:`detail_path` as a ``str``, for a caller that keeps it as one (``Path`` parsing is
        measurable at 10,000 tasks)."""
        return f"{self._details}/{task_id}.json"

    # -- writing -------------------------------------------------------
    def _write_detail(self, task_id: str, text: str, record: Any) -> str:
        """Write ``text``, the encoded ``record`` (redacted and bounded), as the detail of ``task_id``;
        remember what the page shows of it. Returns the detail's path."""
        path = self.detail_file(task_id)
        self._write_in_place(path, text)
        page = self._page[task_id] = packed(page_record(record))
        if self.written is not None:
            self._written_chars += len(text)
            if self._written_chars <= KEEP_WRITTEN_CHARS:
                self.written.append((task_id, text, page))
            else:
                self.written = None
        return path

    def copy_detail(self, source: DetailFiles, task_id: str) -> None:
        """Copy the detail of ``task_id`` from ``source`` byte for byte (``carry_over``; see :meth:`same_detail`)."""
        target = self.detail_file(task_id)
        self._folder_of(target)
        shutil.copyfile(source.detail_file(task_id), target)

    # -- reading -------------------------------------------------------
    def detail_ids(self) -> list[str]:
        """The ids of the tasks this run holds a detail of (readable or not), sorted as strings
        (``Path`` sorting was measurable). A writer's temporary name (``.<task>.json.<tag>.tmp``) is none."""
        try:
            return sorted(e.name[:-5] for e in os.scandir(self._details) if e.name.endswith(".json"))
        except OSError:  # no details yet
            return []

    def read_detail(self, task_id: str) -> dict[str, Any] | None:
        """The detail record of ``task_id``; ``None`` when there is none, or it is not one (cut short by a kill)."""
        return read_detail_file(self.detail_file(task_id))

    def has_detail(self, task_id: str) -> bool:
        """Whether ``task_id`` has a detail here (a task that ended), without reading it."""
        return os.path.exists(self.detail_file(task_id))

    def same_detail(self, other: DetailFiles, task_id: str) -> bool:
        """Whether the detail of ``task_id`` here is byte for byte ``other``'s (a copy ``carry_over`` made)."""
        try:
            with open(self.detail_file(task_id), "rb") as mine, open(other.detail_file(task_id), "rb") as theirs:
                return mine.read() == theirs.read()
        except OSError:
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
        then, read alone, the file of each ``wanted`` task none of them sent (a task not done has none).

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
