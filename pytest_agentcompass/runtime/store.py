"""The run directory: the only code that writes into it.

Layout of ``<output_dir>/<request>/<run id>/``::

    run_info.json          written first, updated at the end
    plans.jsonl            every ExecutionPlan, appended before its Environment opens
    details/<task>.json    one terminal record per task: the countable set
    retry_details/<task>/  discarded tries, never counted
    checkpoints/<task>/    evaluated attempts of unfinished tasks
    summary.json           aggregate metrics, written by finalization

Every JSON file is written to a temporary name and renamed, so a killed run
never leaves half a file, and every value passes through the redactor.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..redact import Redactor
from ..types import ExecutionPlan, RunResult, to_jsonable

__all__ = ["RunStore", "new_run_id", "read_json"]

RUN_INFO = "run_info.json"
#: Records that may wait for the writer thread before submitting blocks.
MAX_QUEUED_WRITES = 64


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%S") + "-" + secrets.token_hex(3)


def _fallback(value: Any) -> Any:
    # Only called by the C encoder for types JSON does not know.
    return to_jsonable(value)


def _readable(value: Any, depth: int = 2, indent: str = "") -> str:
    """One entry per line for the first ``depth`` levels, compact below.

    Keeps ``run_info.json`` readable without the pure-Python indenting
    encoder, which costs seconds once ten thousand plans are recorded.
    """
    if depth == 0 or not isinstance(value, dict) or not value:
        return json.dumps(value, separators=(",", ": "), default=_fallback)
    inner = indent + "  "
    items = [f"{inner}{json.dumps(str(k))}: {_readable(v, depth - 1, inner)}" for k, v in value.items()]
    return "{\n" + ",\n".join(items) + "\n" + indent + "}"


def read_json(path: Path) -> Any:
    with path.open(encoding="utf-8") as fh:
        return json.load(fh)


class RunStore:
    """Reads and writes one run directory."""

    def __init__(self, run_dir: Path, redactor: Redactor | None = None) -> None:
        self.run_dir = run_dir
        self.redactor = redactor or Redactor()
        self.details_dir = run_dir / "details"
        self.retry_dir = run_dir / "retry_details"
        self.checkpoint_dir = run_dir / "checkpoints"
        self._plans_file: Any = None
        self._made: set[Path] = set()
        self._writer: ThreadPoolExecutor | None = None
        self._failures: list[BaseException] = []
        self._backlog = threading.BoundedSemaphore(MAX_QUEUED_WRITES)
        # Most runs never checkpoint: remember that instead of probing per task.
        self._checkpoints_seen = self.checkpoint_dir.is_dir()

    # -- plumbing ------------------------------------------------------
    def _encode(self, data: Any, pretty: bool) -> str:
        value = self.redactor.apply(data) if self.redactor else data
        return _readable(value) if pretty else json.dumps(value, separators=(",", ":"), default=_fallback)

    def _write_text(self, path: Path, text: str) -> None:
        if path.parent not in self._made:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._made.add(path.parent)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            tmp.write_text(text + "\n", encoding="utf-8")
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def _in_background(self, action: Callable[..., Any], *args: Any) -> None:
        """Queue file work on the store's writer thread, in submission order.

        Creating files is the slowest part of a no-op task; the event loop
        should not wait for it. :meth:`flush` waits, and raises what failed.
        """
        if self._writer is None:
            self._writer = ThreadPoolExecutor(1, thread_name_prefix="agentcompass-store")
        # Backpressure: when the disk falls behind, wait here rather than hold
        # an ever longer queue of encoded records in memory.
        self._backlog.acquire()

        def run() -> None:
            try:
                action(*args)
            except BaseException as exc:  # kept for flush(): a lost write must not pass silently
                self._failures.append(exc)
            finally:
                self._backlog.release()

        self._writer.submit(run)

    def flush(self) -> None:
        """Wait for queued writes; raise the first one that failed."""
        if self._writer is not None:
            self._writer.submit(lambda: None).result()
        if self._failures:
            failure = self._failures[0]
            self._failures.clear()
            raise OSError(f"writing into {self.run_dir} failed: {failure}") from failure

    def write_json(self, path: Path, data: Any, *, pretty: bool = False) -> Path:
        """Atomically write ``data`` (redacted) to ``path``.

        Per-task records are compact (the C encoder is several times faster
        than the indenting one); run-level files are ``pretty`` for people.
        """
        self._write_text(path, self._encode(data, pretty))
        return path

    def close(self) -> None:
        """Finish queued writes and release the writer thread and the plans file. Idempotent."""
        try:
            self.flush()
        finally:
            if self._writer is not None:
                self._writer.shutdown(wait=True)
                self._writer = None
            if self._plans_file is not None:
                self._plans_file.close()
                self._plans_file = None

    # -- run info ------------------------------------------------------
    def read_run_info(self) -> dict[str, Any]:
        path = self.run_dir / RUN_INFO
        return dict(read_json(path)) if path.exists() else {}

    def write_run_info(self, info: Mapping[str, Any]) -> None:
        self.write_json(self.run_dir / RUN_INFO, dict(info), pretty=True)

    def update_run_info(self, **changes: Any) -> dict[str, Any]:
        info = self.read_run_info()
        info.update(changes)
        self.write_run_info(info)
        return info

    # -- plans ---------------------------------------------------------
    def record_plan(self, plan: ExecutionPlan) -> None:
        """Append ``plan`` durably; folded into ``run_info.json`` by :meth:`resolved_plans`."""
        if self._plans_file is None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            path = self.run_dir / "plans.jsonl"
            self._plans_file = path.open("a+", encoding="utf-8")
            if self._plans_file.tell():
                self._plans_file.seek(self._plans_file.tell() - 1)
                if self._plans_file.read(1) != "\n":  # a kill cut the last line: end it
                    self._plans_file.write("\n")
        line = json.dumps(self.redactor.apply(plan.to_dict()), default=_fallback)
        self._plans_file.write(line + "\n")
        self._plans_file.flush()

    def resolved_plans(self) -> dict[str, dict[str, Any]]:
        """``{task_id: {attempt_index: plan}}``, the last plan recorded for each attempt."""
        out: dict[str, dict[str, Any]] = {}
        path = self.run_dir / "plans.jsonl"
        if not path.exists():
            return out
        with path.open(encoding="utf-8") as fh:
            for line in fh:
                try:
                    plan = json.loads(line)
                except json.JSONDecodeError:  # a line cut by a kill
                    continue
                out.setdefault(plan["task_id"], {})[str(plan["attempt_index"])] = plan
        return out

    # -- details -------------------------------------------------------
    def detail_path(self, task_id: str) -> Path:
        return self.details_dir / f"{task_id}.json"

    def save_partial_result(self, task_id: str, detail: Mapping[str, Any]) -> Path:
        """Queue the terminal record of ``task_id``, then the removal of its attempt checkpoints.

        The writer thread keeps that order, so a kill in between leaves a
        detail and stale checkpoints (harmless), never checkpoints alone.
        """
        path = self.detail_path(task_id)
        self._in_background(self._write_text, path, self._encode(detail, False))
        if self._checkpoints_seen:
            self._in_background(self.remove_checkpoints, task_id)
        return path

    def iter_details(self) -> Iterator[dict[str, Any]]:
        if not self.details_dir.is_dir():
            return
        for path in sorted(self.details_dir.glob("*.json")):
            try:
                yield read_json(path)
            except (OSError, json.JSONDecodeError):
                continue

    def save_retry_detail(self, task_id: str, attempt_index: int, retry_number: int, payload: Any) -> Path:
        path = self.retry_dir / task_id / f"attempt-{attempt_index}-retry-{retry_number}.json"
        self._in_background(self._write_text, path, self._encode(payload, False))
        return path

    # -- checkpoints ---------------------------------------------------
    def save_checkpoint(self, task_id: str, attempt_index: int, fingerprint: str, result: RunResult) -> None:
        path = self.checkpoint_dir / task_id / f"attempt-{attempt_index}.json"
        self._checkpoints_seen = True
        payload = {"fingerprint": fingerprint, "attempt_index": attempt_index, "result": result.to_dict()}
        self._in_background(self._write_text, path, self._encode(payload, False))

    def load_checkpoints(self, task_id: str, fingerprint: str) -> tuple[dict[int, RunResult], int]:
        """Compatible checkpoints of ``task_id`` and the number of incompatible ones ignored."""
        folder = self.checkpoint_dir / task_id
        restored: dict[int, RunResult] = {}
        ignored = 0
        if not self._checkpoints_seen or not folder.is_dir():
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
            self._made.discard(folder)

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
