"""One request's state in an orchestration: prepare, run tasks, finalize, stop."""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import shutil
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any, overload

from .._compat import maybe_await
from ..benchmark import BaseBenchmark
from ..errors import AgentCompassError, PreflightError
from ..models.usage import sum_usage
from ..types import RunResult, RunStatus, TaskSpec, to_jsonable
from .context import RequestContext
from .logs import capture_task_logs
from .store import RUN_INFO, RunStore, read_json
from .task import TaskOutcome, outcome_from_detail, run_task

__all__ = ["RequestRuntime", "find_resumable_run", "find_reusable_run"]

log = logging.getLogger("pytest_agentcompass")


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


class RequestRuntime:
    """Everything the Orchestrator tracks for one request.

    :param tasks: The tasks the benchmark selected, in order.
    :param wanted: Ids of the tasks pytest will run (after ``-k``/``-m``/``--lf``).
    :param rerun: Ids that must run even if a reusable detail exists (``--lf``).
    :param order: Dispatch position of each wanted id (pytest's item order).
    """

    def __init__(
        self,
        ctx: RequestContext,
        tasks: Sequence[TaskSpec],
        wanted: set[str],
        *,
        config_dump: dict[str, Any],
        reuse_dir: Path | None = None,
        resumed: bool = False,
        rerun: set[str] | None = None,
        order: dict[str, int] | None = None,
    ) -> None:
        self.ctx = ctx
        self.name = ctx.req.name
        self.tasks = list(tasks)
        self.wanted = wanted
        self.rerun = rerun or set()
        self.order = order or {}
        self.config_dump = config_dump
        self.reuse_dir = reuse_dir
        self.resumed = resumed
        self.pending: deque[TaskSpec] = deque()
        self.active: dict[str, TaskSpec] = {}
        self.outcomes: dict[str, TaskOutcome] = {}
        self.prepared = False
        self.finalized = False
        self.failed: str | None = None  # preflight/preparation failure message
        self.metrics: dict[str, Any] | None = None
        #: Token totals over the tasks' ``usage`` records (model-calling harnesses), set by :meth:`finalize`.
        self.usage: dict[str, Any] | None = None
        self.notes: list[str] = []

    @property
    def store(self) -> RunStore:
        return self.ctx.store

    @property
    def drained(self) -> bool:
        return not self.pending and not self.active

    # -- preflight -----------------------------------------------------
    async def preflight(self) -> None:
        """Check components before the deadline starts.

        :raises PreflightError: with the request name in the message.
        """
        ctx = self.ctx
        try:
            await ctx.provider.preflight()
            if ctx.harness is not None:
                await maybe_await(ctx.harness.preflight(ctx.req))
            if self.tasks:
                # A plan the provider cannot honour fails here, before anything opens.
                ctx.planner.plan(self.tasks[0], 0)
        except AgentCompassError as exc:
            raise PreflightError(f"request {self.name!r}: {exc}") from None

    # -- preparation -----------------------------------------------------
    async def prepare(self) -> list[TaskOutcome]:
        """Write ``run_info.json``, take over reusable details, fill the queue.

        Returns the outcomes taken from reused or resumed details of wanted tasks.
        """
        store = self.store
        info = store.read_run_info() if self.resumed else {}
        info.update(
            run_id=self.ctx.run_id,
            request=self.name,
            status="running",
            started_at=info.get("started_at", _now()),
            resumed_at=[*info.get("resumed_at", []), _now()] if self.resumed else [],
            pid=os.getpid(),
            fingerprint=self.ctx.fingerprint,
            config=self.config_dump,
            tasks_selected=len(self.tasks),
            tasks_wanted=len(self.wanted),
            reused_from=str(self.reuse_dir) if self.reuse_dir else None,
        )
        store.write_run_info(info)
        if self.resumed:
            store.remove_stale_temp_files()
            swept = await self.ctx.provider.sweep(self.ctx.run_id)
            if swept:
                self.notes.append(f"removed {swept} environment(s) left behind by the interrupted run")
        if self.reuse_dir is not None:
            self._materialize(self.reuse_dir)
        recorded = self._load_recorded()
        taken: list[TaskOutcome] = []
        for task in self.tasks:
            outcome = recorded.get(task.task_id)
            if outcome is not None:
                self.outcomes[task.task_id] = outcome
                if task.task_id in self.wanted:
                    taken.append(outcome)
            elif task.task_id in self.wanted:
                self.pending.append(task)
        if self.order:
            # pytest's item order wins (``--ff``, ``-p randomly``, reordering plugins).
            self.pending = deque(sorted(self.pending, key=lambda t: self.order.get(t.task_id, 0)))
        self.prepared = True
        return taken

    def _materialize(self, source: Path) -> None:
        """Copy compatible, non-error details of ``source`` into this run."""
        copied = skipped = 0
        by_id = {t.task_id: t for t in self.tasks}
        for path in sorted((source / "details").glob("*.json")):
            task = by_id.get(path.stem)
            if task is None or task.task_id in self.rerun:
                continue
            try:
                detail = read_json(path)
            except (OSError, json.JSONDecodeError):
                skipped += 1
                continue
            if (
                detail.get("fingerprint") != self.ctx.task_fingerprint(task)
                or RunStatus(detail.get("status", "completed")).is_error
            ):
                skipped += 1
                continue
            target = self.store.detail_path(task.task_id)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            copied += 1
        self.notes.append(f"reused {copied} task(s) from {source}")
        if skipped:
            self.notes.append(f"{skipped} detail(s) in {source} not reused (errors or a changed config/task)")

    def _load_recorded(self) -> dict[str, TaskOutcome]:
        out: dict[str, TaskOutcome] = {}
        by_id = {t.task_id: t for t in self.tasks}
        ignored = 0
        for detail in self.store.iter_details():
            task = by_id.get(str(detail.get("task_id")))
            if task is None or task.task_id in self.rerun:
                continue
            if detail.get("fingerprint") != self.ctx.task_fingerprint(task):
                ignored += 1
                continue
            out[task.task_id] = outcome_from_detail(self.name, task, detail, self.store.detail_path(task.task_id))
        if ignored:
            self.notes.append(f"ignored {ignored} recorded detail(s) made with a different config")
        return out

    # -- tasks -----------------------------------------------------------
    async def run(self, task: TaskSpec) -> TaskOutcome:
        with capture_task_logs() as logs:
            outcome = await run_task(self.ctx, task)
        redactor = self.store.redactor
        outcome.logs = [redactor.text(line) for line in logs] if redactor and logs else logs
        self.outcomes[task.task_id] = outcome
        # Notes about ignored state must be visible in the summary, not only in one detail.
        self.notes.extend(f"task {task.task_id}: {note}" for note in outcome.notes if note.startswith("ignored"))
        return outcome

    def cancelled_outcome(self, task: TaskSpec, reason: str) -> TaskOutcome:
        result = RunResult(task.task_id, status=RunStatus.CANCELLED, error=reason)
        return TaskOutcome(request=self.name, task=task, result=result, passed=False)

    def error_outcome(self, task: TaskSpec, message: str) -> TaskOutcome:
        result = RunResult(task.task_id, status=RunStatus.INFERENCE_ERROR, error=message)
        return TaskOutcome(request=self.name, task=task, result=result, passed=False)

    async def aclose(self) -> None:
        """Release what the harness shares between tasks; a failure is a warning."""
        harness = self.ctx.harness
        if harness is None:
            return
        try:
            await maybe_await(harness.aclose())
        except Exception as exc:
            log.warning("request %s: closing the harness failed: %s: %s", self.name, type(exc).__name__, exc)

    # -- finalization ------------------------------------------------------
    async def finalize(self, status: str = "completed") -> dict[str, Any]:
        """Aggregate in task order and write ``summary.json`` and the final ``run_info.json``."""
        ordered = [self.outcomes[t.task_id] for t in self.tasks if t.task_id in self.outcomes]
        benchmark = self.ctx.benchmark
        if type(benchmark).aggregate_metrics is BaseBenchmark.aggregate_metrics:
            # The default only reads scores and statuses, which slim outcomes keep.
            results: Sequence[RunResult] = [o.result for o in ordered]
        else:
            results = StoredResults(ordered)
        try:
            metrics = await maybe_await(benchmark.aggregate_metrics(results, self.ctx.req))
        except Exception as exc:
            log.warning("request %s: aggregate_metrics failed: %s", self.name, exc)
            metrics = {"error": f"aggregate_metrics failed: {type(exc).__name__}: {exc}"}
        self.metrics = dict(metrics)
        self.usage = sum_usage(o.result.metadata.get("usage") for o in ordered)
        summary = {
            "request": self.name,
            "run_id": self.ctx.run_id,
            "status": status,
            "metrics": to_jsonable(self.metrics),
            "counts": self.counts(),
            "usage": self.usage,
            "tasks": [
                {
                    "task_id": o.task.task_id,
                    "status": o.result.status.value,
                    "score": o.result.score,
                    "passed": o.passed,
                    "reused": o.reused,
                }
                for o in ordered
            ],
        }
        self.store.write_summary(summary)
        self.store.drop_empty_checkpoints()
        self._close_info(status)
        self.finalized = True
        return summary

    def counts(self) -> dict[str, int]:
        outcomes = list(self.outcomes.values())
        return {
            "tasks": len(outcomes),
            "passed": sum(1 for o in outcomes if o.passed),
            "failed": sum(1 for o in outcomes if not o.passed and not o.result.is_error),
            "errors": sum(1 for o in outcomes if o.result.is_error),
            "reused": sum(1 for o in outcomes if o.reused),
            "retries": sum(o.retries for o in outcomes),
        }

    def stop(self, status: str, reason: str) -> None:
        """Persist the terminal state of a request that did not finish."""
        unfinished = [t.task_id for t in self.tasks if t.task_id in self.wanted and t.task_id not in self.outcomes]
        self._close_info(status, stop_reason=reason, unfinished_tasks=unfinished)

    def _close_info(self, status: str, **extra: Any) -> None:
        kept = [e for o in self.outcomes.values() if not o.reused for e in o.kept_environments]
        self.store.close()
        self.store.update_run_info(
            status=status,
            finished_at=_now(),
            counts=self.counts(),
            notes=self.notes,
            kept_environments=kept,
            with_plans=True,
            **extra,
        )
        _release_lock(self.store.run_dir)


class StoredResults(Sequence[RunResult]):
    """Terminal results in task order, read back from their detail files one at a time.

    Finalization hands this to ``aggregate_metrics`` so that memory does not
    grow with outputs, artifacts and evidence of every task in the request.
    """

    def __init__(self, outcomes: Sequence[TaskOutcome]) -> None:
        self._outcomes = list(outcomes)

    def __len__(self) -> int:
        return len(self._outcomes)

    @overload
    def __getitem__(self, index: int) -> RunResult: ...

    @overload
    def __getitem__(self, index: slice) -> list[RunResult]: ...

    def __getitem__(self, index: int | slice) -> RunResult | list[RunResult]:
        if isinstance(index, slice):
            return [self._load(o) for o in self._outcomes[index]]
        return self._load(self._outcomes[index])

    @staticmethod
    def _load(outcome: TaskOutcome) -> RunResult:
        if outcome.detail_path is not None:
            try:
                return RunResult.from_dict(read_json(outcome.detail_path))
            except (OSError, ValueError):
                pass  # fall back to what is in memory
        return outcome.result


# -- locating earlier runs ----------------------------------------------------
def find_reusable_run(request_dir: Path, spec: str, current: Path | None = None) -> Path:
    """Resolve ``reuse: latest | <dir>`` to a run directory.

    :raises AgentCompassError: when there is nothing to reuse.
    """
    if spec != "latest":
        path = Path(spec)
        if not (path / "details").is_dir():
            raise AgentCompassError(f"reuse: {path} is not a run directory (no details/ folder)")
        return path
    runs = sorted(
        (p for p in request_dir.glob("*") if p.is_dir() and p != current and (p / "details").is_dir()),
        key=lambda p: p.name,
    )
    if not runs:
        raise AgentCompassError(f"reuse: latest: no earlier run with results under {request_dir}")
    return runs[-1]


def find_resumable_run(request_dir: Path, fingerprint: str) -> Path | None:
    """The newest unfinished run of this request made with the same settings, if no process holds it."""
    if not request_dir.is_dir():
        return None
    for run_dir in sorted((p for p in request_dir.iterdir() if p.is_dir()), key=lambda p: p.name, reverse=True):
        try:
            info = read_json(run_dir / RUN_INFO)
        except (OSError, json.JSONDecodeError):
            continue
        if info.get("status") == "completed":
            return None  # the latest finished run ends the chain: start fresh
        if info.get("fingerprint") == fingerprint and _take_lock(run_dir):
            return run_dir
    return None


def _take_lock(run_dir: Path) -> bool:
    """Claim ``run_dir`` for this process unless a live process holds it."""
    lock = run_dir / "run.lock"
    try:
        pid = int(lock.read_text().strip())
    except (OSError, ValueError):
        pid = 0
    if pid and pid != os.getpid() and _alive(pid):
        return False
    lock.write_text(str(os.getpid()))
    return True


def claim_run_dir(run_dir: Path, request: str, fingerprint: str) -> None:
    """Create (or take over) ``run_dir``; ``run_info.json`` exists from the first moment."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "run.lock").write_text(str(os.getpid()))
    if not (run_dir / RUN_INFO).exists():
        RunStore(run_dir).write_run_info(
            {"run_id": run_dir.name, "request": request, "status": "created", "fingerprint": fingerprint}
        )


def _release_lock(run_dir: Path) -> None:
    (run_dir / "run.lock").unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
