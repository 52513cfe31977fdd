"""One run directory's files: the only code that writes into them.

Layout of ``<output_dir>/<request>/<run id>/``::

    run_info.json          written first, updated at the end
    plans.jsonl            every ExecutionPlan, appended before its Environment opens
    details/<task>.json    one terminal record per task: the countable set
                           (or details/journal.jsonl, one line per record: ``details``)
    retry_details/<task>/  discarded tries, never counted
    checkpoints/<task>/    evaluated attempts of unfinished tasks
    summary.json           aggregate metrics, written by finalization
    report.html            the page of the run (``reports.html``), written after the summary
    artifacts/<task>/      what components save for an attempt (``component_files``)
    blobs/<task>/          ``bytes`` values of results, as files
    <folder>/...           what components save for the request (``component_files``, e.g. ``images/``)

Only ``details`` knows where a task's detail lives: every other reader goes
through :class:`RunStore` (``iter_details``, ``detail_ids``, ``read_detail``)
or :func:`holds_details`.

Every JSON file but a detail is written to a temporary name and renamed, so a
killed run never leaves half of it; a detail is written in place (see
``_write_in_place``: half a detail is not JSON and reads as a task not done).
Every value passes through the redactor, and every text field of a per-task
record is bounded (``bounds``): a detail stores its output once, at most
``field_limit`` characters of it, and says what was cut.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from ...vocabulary.redact import Redactor
from ...vocabulary.types import ExecutionPlan, RunResult
from .bounds import DEFAULT_FIELD_LIMIT, TRUNCATED_KEY, bound_fields, cut_note, fitted_limit, same_as_task
from .component_files import ComponentFiles
from .details import DETAILS, DetailFiles, DetailsLayout
from .run_info import PLANS_KEY, RUN_INFO, fold_plans, read_run_info_head
from .writing import fallback, read_json, readable

__all__ = ["PLANS_KEY", "RUN_INFO", "RunStore", "read_json", "read_run_info_head"]


#: Values that hold no ``bytes``, known by their exact type: most of a result's metadata.
_SCALARS = frozenset({str, int, float, bool, type(None)})


def _holds_bytes(value: Any) -> bool:
    """Whether ``value`` holds a ``bytes`` value anywhere (asked twice per task, nearly always no)."""
    if type(value) in _SCALARS:
        return False
    if isinstance(value, bytes | bytearray):
        return True
    if isinstance(value, Mapping):
        return any(type(v) not in _SCALARS and _holds_bytes(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(type(v) not in _SCALARS and _holds_bytes(v) for v in value)
    return False


def _segment(key: Any) -> str:
    """A mapping key as one safe path segment."""
    text = re.sub(r"[^A-Za-z0-9._-]+", "_", str(key)).strip(".") or "_"
    return text[:100]


#: The file that keeps pytest out of a run directory (see :meth:`RunStore.keep_from_collection`).
COLLECTION_MARKER = "pyvenv.cfg"
MARKER_TEXT = (
    "# Not a virtual environment: this run directory of pytest-agentcompass holds files an agent\n"
    "# under test wrote. pytest skips any folder holding a pyvenv.cfg (unless --collect-in-virtualenv\n"
    "# is given), so a later plain `pytest` never collects or imports them.\n"
)

#: The top-level names of a run directory the store writes itself: no component file goes there.
OWN_NAMES = frozenset(
    {
        RUN_INFO,
        "plans.jsonl",
        DETAILS,
        "retry_details",
        "checkpoints",
        "summary.json",
        "report.html",
        "artifacts",
        "blobs",
        COLLECTION_MARKER,
        "run.lock",  # runs.LOCK_FILE
    }
)


class RunStore(DetailFiles):
    """Reads and writes one run directory (its details: :class:`~.details.DetailFiles`)."""

    def __init__(
        self,
        run_dir: Path,
        redactor: Redactor | None = None,
        field_limit: int = DEFAULT_FIELD_LIMIT,
        details_layout: DetailsLayout = "files",
    ) -> None:
        super().__init__(run_dir, details_layout)
        self.run_dir = run_dir
        self.redactor = redactor or Redactor()
        #: Characters kept per text field of a per-task record (``execution.max_stored_chars``).
        self.field_limit = field_limit
        #: The line that said what the last bounded record lost (its fields may be cut below
        #: ``field_limit`` when the record is large as a whole: ``bounds.fitted_limit``).
        self.last_cut_note = ""
        self.plans_path = run_dir / "plans.jsonl"
        self.retry_dir = run_dir / "retry_details"
        self.checkpoint_dir = run_dir / "checkpoints"
        self._plans_file: Any = None
        self._closed = False
        # Most runs never checkpoint: remember that instead of probing per task.
        self._checkpoints_seen = self.checkpoint_dir.is_dir()
        #: What components write: each attempt's artifacts, and the request's files (its ``RunFiles``).
        self.component_files = ComponentFiles(self, OWN_NAMES)
        #: The value :meth:`_encode` encoded last (redacted): a detail's, for its page record.
        self._encoded: Any = None

    # -- plumbing ------------------------------------------------------
    def _encode(self, data: Any, pretty: bool) -> str:
        value = self._encoded = self.redactor.apply(data) if self.redactor else data
        return readable(value) if pretty else json.dumps(value, separators=(",", ":"), default=fallback)

    def _bounded(
        self, record: Mapping[str, Any], encode: Callable[[Any], str] | None = None
    ) -> tuple[str, dict[str, int]]:
        """``record`` encoded (redacted), its text fields cut to :attr:`field_limit` characters.

        What was cut is listed under ``truncated_fields`` and, in a record
        with ``notes`` (a detail), said there too. A record whose whole text
        fits holds no field past the limit: the common case costs one length check.
        """
        encode = encode or (lambda value: self._encode(value, False))
        text = encode(record)
        if len(text) <= self.field_limit:
            return text, {}
        limit = fitted_limit(record, self.field_limit)
        bounded, cuts = bound_fields(record, limit)
        if not cuts:
            return text, {}
        self.last_cut_note = cut_note(cuts, limit, self.field_limit)
        record = {**bounded, TRUNCATED_KEY: cuts}
        if isinstance(record.get("notes"), list):
            record["notes"] = [*record["notes"], self.last_cut_note]
        return encode(record), cuts

    def write_json(self, path: Path, data: Any, *, pretty: bool = False) -> Path:
        """Atomically write ``data`` (redacted) to ``path``.

        Per-task records are compact (the C encoder is several times faster
        than the indenting one); run-level files are ``pretty`` for people.
        """
        self._write_text(path, self._encode(data, pretty))
        return path

    def keep_from_collection(self) -> None:
        """Write the marker that makes pytest skip this run directory: a ``pyvenv.cfg``.

        pytest does not collect inside a virtual environment, which it knows by
        this file (pytest >= 8.3), whatever ``norecursedirs`` says and with no
        plugin loaded: what an agent left in the run (a ``conftest.py``, a
        ``test_*.py`` among its logs) never runs on the host on a later plain
        ``pytest``. The marker sits at the run's top, where no copy of an
        agent's files lands, so no agent can replace or remove it.
        """
        path = self.run_dir / COLLECTION_MARKER
        if not path.is_file():
            self._write_text(path, MARKER_TEXT)

    def close(self) -> None:
        """Close the plans file; a plan recorded later (an attempt that outlived its run) is dropped. Idempotent."""
        self._closed = True
        if self._plans_file is not None:
            self._plans_file.close()
            self._plans_file = None

    # -- run info ------------------------------------------------------
    def read_run_info(self) -> dict[str, Any]:
        """``run_info.json`` without its recorded plans (those are rebuilt from ``plans.jsonl``)."""
        path = self.run_dir / RUN_INFO
        info = dict(read_run_info_head(path)) if path.exists() else {}
        info.pop(PLANS_KEY, None)
        return info

    def write_run_info(self, info: Mapping[str, Any], *, with_plans: bool = False) -> None:
        """Write ``run_info.json``; ``with_plans`` folds every recorded plan into it."""
        if with_plans:
            self._write_chunks(
                self.run_dir / RUN_INFO, fold_plans(self._encode(dict(info), pretty=True), self.plans_path)
            )
        else:
            self.write_json(self.run_dir / RUN_INFO, dict(info), pretty=True)

    def update_run_info(self, *, with_plans: bool = False, **changes: Any) -> dict[str, Any]:
        info = self.read_run_info()
        info.update(changes)
        self.write_run_info(info, with_plans=with_plans)
        return info

    # -- plans ---------------------------------------------------------
    def record_plan(self, plan: ExecutionPlan, placement: Mapping[str, str] | None = None) -> None:
        """Append ``plan`` durably; folded into ``run_info.json`` by ``write_run_info(with_plans=True)``.

        ``placement``: where the attempt's environments ran (``{"task": <engine>, ...}``),
        known only once they opened, so recorded again at the attempt's end: the last line wins.
        """
        if self._closed:
            return  # the run's end is recorded: reopening the file would only leak it
        if self._plans_file is None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._plans_file = self.plans_path.open("a+", encoding="utf-8")
            if self._plans_file.tell():
                self._plans_file.seek(self._plans_file.tell() - 1)
                if self._plans_file.read(1) != "\n":  # a kill cut the last line: end it
                    self._plans_file.write("\n")
        data = plan.to_dict()
        if placement:
            data["placement"] = dict(placement)
        line = json.dumps(self.redactor.apply(data), default=fallback)
        self._plans_file.write(line + "\n")
        self._plans_file.flush()

    # -- details -------------------------------------------------------
    def save_partial_result(self, task_id: str, detail: Mapping[str, Any], *, notes: list[str] | None = None) -> str:
        """Write the terminal record of ``task_id``, then remove its attempt checkpoints.

        In that order, so a kill in between leaves a detail and stale
        checkpoints (harmless), never checkpoints alone. An attempt's entry
        does not repeat what equals the task's result, and text fields are
        bounded; ``notes`` receives the line that says what was cut.
        """
        text, cuts = self._bounded(same_as_task(detail))
        written, self._encoded = self._encoded, None  # what the file holds, redacted and bounded
        if cuts and notes is not None:
            notes.append(self.last_cut_note)
        path = self._write_detail(task_id, text, written)
        if self._checkpoints_seen:
            self.remove_checkpoints(task_id)
        return path

    def externalize_bytes(self, task_id: str, result: RunResult, folder: str = "") -> RunResult:
        """``result`` with every ``bytes`` value of its artifacts and metadata written to a file
        under ``blobs/<task>/[<folder>/]`` and replaced by ``{"bytes_file": <path in the run>, "size": n}``."""
        base = f"blobs/{task_id}" + (f"/{folder}" if folder else "")
        changed: dict[str, Any] = {}
        for name in ("artifacts", "metadata"):
            value = getattr(result, name)
            if not _holds_bytes(value):  # nearly always: no file paths built per key for nothing
                continue
            replaced = self._externalize(value, f"{base}/{name}")
            if replaced is not value:
                changed[name] = replaced
        return dataclasses.replace(result, **changed) if changed else result

    def _externalize(self, value: Any, where: str) -> Any:
        if isinstance(value, bytes | bytearray):
            path = self.run_dir / where
            with self._replacing(path) as tmp, open(tmp, "wb") as fh:
                fh.write(value)
            return {"bytes_file": where, "size": len(value)}
        if isinstance(value, Mapping):
            out = {k: self._externalize(v, f"{where}/{_segment(k)}") for k, v in value.items()}
            return value if all(out[k] is value[k] for k in value) else out
        if isinstance(value, list | tuple):
            items = [self._externalize(v, f"{where}/{i}") for i, v in enumerate(value)]
            return value if all(a is b for a, b in zip(items, value, strict=True)) else items
        return value

    def save_retry_detail(self, task_id: str, attempt_index: int, retry_number: int, payload: Any) -> Path:
        path = self.retry_dir / task_id / f"attempt-{attempt_index}-retry-{retry_number}.json"
        text = self._bounded(payload)[0] if isinstance(payload, Mapping) else self._encode(payload, False)
        self._write_text(path, text)
        return path

    # -- checkpoints ---------------------------------------------------
    def save_checkpoint(self, task_id: str, attempt_index: int, fingerprint: str, result: RunResult) -> None:
        path = self.checkpoint_dir / task_id / f"attempt-{attempt_index}.json"
        self._checkpoints_seen = True
        result = self.externalize_bytes(task_id, result, f"attempt-{attempt_index}")
        payload = {"fingerprint": fingerprint, "attempt_index": attempt_index, "result": result.to_dict()}
        self._write_text(path, self._bounded(payload)[0])

    def load_checkpoints(self, task_id: str, fingerprint: str) -> tuple[dict[int, RunResult], int]:
        """Compatible checkpoints of ``task_id`` and the number of incompatible ones ignored."""
        restored: dict[int, RunResult] = {}
        ignored = 0
        if not self._checkpoints_seen:  # asked once per task: no path built for nothing
            return restored, ignored
        folder = self.checkpoint_dir / task_id
        if not folder.is_dir():
            return restored, ignored
        for path in folder.glob("attempt-*.json"):
            try:
                data = read_json(path)
            except (OSError, json.JSONDecodeError):
                ignored += 1
                continue
            if data.get("fingerprint") != fingerprint:
                ignored += 1
                continue
            restored[int(data["attempt_index"])] = RunResult.from_dict(data["result"])
        return restored, ignored

    def remove_checkpoints(self, task_id: str) -> None:
        folder = self.checkpoint_dir / task_id
        if folder.exists():  # most tasks never had one: skip the failing rmtree
            shutil.rmtree(folder, ignore_errors=True)
            self._made.discard(str(folder))

    def remove_stale_temp_files(self) -> int:
        """Delete temporary files a killed writer left (call only while holding the run's lock)."""
        stale = [p for p in self.run_dir.rglob(".*.tmp") if p.is_file()]
        for path in stale:
            path.unlink(missing_ok=True)
        return len(stale)

    def drop_empty_checkpoints(self) -> None:
        try:
            self.checkpoint_dir.rmdir()
        except OSError:  # absent, or holds checkpoints of unfinished tasks
            pass

    def write_summary(self, summary: Mapping[str, Any]) -> Path:
        return self.write_json(self.run_dir / "summary.json", summary, pretty=True)

    def write_page(self, name: str, text: str | Iterable[str]) -> Path:
        """Write a page of the run (``report.html``) at its top level, redacted like every file.

        ``text`` may come in pieces, written as they come; with secrets to mask they are
        joined first (a secret may straddle two pieces).
        """
        path = self.run_dir / name
        if self.redactor:
            self._write_text(path, self.redactor.text(text if isinstance(text, str) else "".join(text)))
        else:
            self._write_chunks(path, [text] if isinstance(text, str) else text)
        return path
