"""One request's state in an orchestration: prepare, run tasks, finalize, stop."""

from __future__ import annotations

import logging
import math
import numbers
import os
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, overload

from .._compat import call_user
from ..benchmark import BaseBenchmark
from ..errors import AgentCompassError, PreflightError
from ..models.usage import sum_usage
from ..types import RunResult, RunStatus, TaskSpec, to_jsonable
from .context import RequestContext
from .logs import capture_task_logs
from .planner import BenchmarkPlanError
from .store import RunStore, copy_details, killed_runs, now, read_json, record_killed, release_run_dir
from .task import TaskOutcome, outcome_from_detail, run_task

__all__ = ["RequestRuntime", "StoredResults"]

log = logging.getLogger("pytest_agentcompass")


class RequestRuntime:
    """Everything the Orchestrator tracks for one request.

    :param tasks: The tasks the benchmark selected, in order.
    :param wanted: Ids of the tasks pytest will run (after ``-k``/``-m``/``--lf``).
    :param rerun: Ids that must run even if a reusable detail exists (``--lf``).
    :param order: Dispatch position of each wanted id (pytest's item order).
    :param shared: Another process prepares and finalizes this run (an xdist
        controller); this one only runs the tasks handed to it.
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
        shared: bool = False,
    ) -> None:
        self.ctx = ctx
        self.shared = shared
        self.name = ctx.req.name
        self.tasks = list(tasks)
        self.wanted = wanted
        self.rerun = rerun or set()
        self.order = order or {}
        self.config_dump = config_dump
        self.reuse_dir = reuse_dir
        #: A shared run's ``reuse`` source, read once from ``run_info.json`` (False: none).
        self._reuse_source: Path | Literal[False] | None = None
        self.resumed = resumed
        self.pending: deque[TaskSpec] = deque()
        self.active: dict[str, TaskSpec] = {}
        self.outcomes: dict[str, TaskOutcome] = {}
        self.prepared = False
        self.finalized = False
        self.failed: str | None = None  # preflight/preparation failure message
        self.failed_status = RunStatus.INFERENCE_ERROR  # the status of the tasks of a failed request
        self.metrics: dict[str, Any] | None = None
        #: Token totals over the tasks' ``usage`` records (model-calling harnesses), set by :meth:`finalize`.
        self.usage: dict[str, Any] | None = None
        #: ``summary.json`` as written by :meth:`finalize`.
        self.summary: dict[str, Any] | None = None
        self.notes: list[str] = []
        #: What failed while the request's shared resources closed (see :meth:`aclose`).
        self.closing_notes: list[str] = []
        #: Run-directory files that could not be written at the end (see :meth:`_unwritten`).
        self.unwritten: list[str] = []
        #: Wanted tasks the resumed run had already finished (set by :meth:`prepare`).
        self.resumed_done = 0

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
        except Exception as exc:  # an SDK's own error (a failed pull, a refused connection) included
            self.failed_status = RunStatus.ENVIRONMENT_ERROR
            where = "" if isinstance(exc, AgentCompassError) else f"environment {ctx.req.environment.id!r} preflight: "
            raise PreflightError(f"request {self.name!r}: {where}{_reason(exc)}") from None
        self.notes.extend(getattr(ctx.provider, "notes", ()))
        try:
            if ctx.harness is not None:
                await call_user(ctx.harness.preflight, ctx.req)
            if self.tasks:
                # A plan the provider cannot honour fails here, before anything opens.
                await ctx.planner.plan(self.tasks[0], 0)
        except BenchmarkPlanError:
            pass  # the benchmark's own fault: every task it hits reports it
        except Exception as exc:
            raise PreflightError(f"request {self.name!r}: {_reason(exc)}") from None

    # -- preparation -----------------------------------------------------
    async def prepare(self) -> list[TaskOutcome]:
        """Write ``run_info.json``, take over reusable details, fill the queue.

        Returns the outcomes taken from reused or resumed details of wanted tasks.
        A shared runtime has nothing to prepare: its tasks are handed to it
        one by one and each checked with :meth:`recorded`.
        """
        if self.shared:
            self.prepared = True
            return []
        store = self.store
        info = store.read_run_info() if self.resumed else {}
        info.update(
            run_id=self.ctx.run_id,
            request=self.name,
            status="running",
            started_at=info.get("started_at", now()),
            resumed_at=[*info.get("resumed_at", []), now()] if self.resumed else [],
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
        # Every killed run of the request, not only the one resumed: another
        # run may have completed since, and the killed one is never resumed.
        for run_id in killed_runs(store.run_dir, include_current=self.resumed):
            swept = await self.ctx.provider.sweep(run_id)
            if swept:
                self.notes.append(f"removed {swept} environment(s) or process(es) left behind by run {run_id}")
            if run_id != store.run_dir.name:  # swept once: later runs leave it alone
                reason = f"its process was killed; run {self.ctx.run_id} removed what it left behind"
                record_killed(store.run_dir.parent / run_id, reason)
        # What the interrupted run already finished, told apart from what ``reuse`` copies in.
        own = {p.stem for p in store.details_dir.glob("*.json")} if self.resumed else set()
        if self.reuse_dir is not None:
            self._materialize(self.reuse_dir)
        recorded = self._load_recorded(own)
        taken: list[TaskOutcome] = []
        for task in self.tasks:
            outcome = recorded.get(task.task_id)
            if outcome is not None:
                self.outcomes[task.task_id] = outcome
                if task.task_id in self.wanted:
                    taken.append(outcome)
            elif task.task_id in self.wanted:
                self.pending.append(task)
        self.resumed_done = sum(1 for o in taken if o.resumed)
        if self.order:
            # pytest's item order wins (``--ff``, ``-p randomly``, reordering plugins).
            self.pending = deque(sorted(self.pending, key=lambda t: self.order.get(t.task_id, 0)))
        self.prepared = True
        return taken

    def _materialize(self, source: Path) -> None:
        """Copy compatible, non-error details of ``source`` into this run."""
        by_id = {t.task_id: t for t in self.tasks}

        def wanted(task_id: str) -> bool:
            return task_id in by_id and task_id not in self.rerun

        def keep(task_id: str, detail: Any) -> bool:
            return (
                detail.get("fingerprint") == self.ctx.task_fingerprint(by_id[task_id])
                and not RunStatus(detail.get("status", "completed")).is_error
            )

        copied, skipped = copy_details(source, self.store, wanted, keep)
        self.notes.append(f"reused {copied} task(s) from {source}")
        if skipped:
            self.notes.append(f"{skipped} detail(s) in {source} not reused (errors or a changed config/task)")

    def _load_recorded(self, own: set[str]) -> dict[str, TaskOutcome]:
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
            path = self.store.detail_path(task.task_id)
            out[task.task_id] = outcome_from_detail(self.name, task, detail, path, resumed=task.task_id in own)
        if ignored:
            self.notes.append(f"ignored {ignored} recorded detail(s) made with a different config")
        return out

    def recorded(self, task: TaskSpec) -> TaskOutcome | None:
        """The recorded outcome of ``task`` in this run directory, if it is usable (shared runs).

        The owner of the run resumed it or copied reused details into it
        before handing out tasks; a detail made with other settings, or of a
        task ``--lf`` reruns, does not count.
        """
        if not self.shared or task.task_id in self.rerun:
            return None
        path = self.store.detail_path(task.task_id)
        try:
            detail = read_json(path)
        except (OSError, ValueError):
            return None  # none yet (the common case), or cut short by a kill
        if not isinstance(detail, dict) or detail.get("fingerprint") != self.ctx.task_fingerprint(task):
            return None
        return outcome_from_detail(self.name, task, detail, path, resumed=not self._copied_by_reuse(path))

    def _copied_by_reuse(self, path: Path) -> bool:
        """Whether the owner copied the detail at ``path`` from a ``reuse`` source (else this run made it).

        The owner names the source in ``run_info.json``; a copy is byte for byte.
        """
        if self._reuse_source is None:
            info = self.store.read_run_info()
            self._reuse_source = Path(info["reused_from"]) if info.get("reused_from") else False
        if self._reuse_source is False:
            return False
        try:
            return (self._reuse_source / "details" / path.name).read_bytes() == path.read_bytes()
        except OSError:
            return False

    # -- tasks -----------------------------------------------------------
    async def run(self, task: TaskSpec) -> TaskOutcome:
        with capture_task_logs() as capture:
            outcome = await run_task(self.ctx, task)
        redactor = self.store.redactor
        if redactor:  # a key read at run time is no ${VAR}: mask it in what the report shows
            outcome.logs = [redactor.text(line) for line in capture.logs]
            outcome.output = redactor.text("".join(capture.output))
        else:
            outcome.logs = capture.logs
            outcome.output = "".join(capture.output)
        self.outcomes[task.task_id] = outcome
        # Notes about ignored state must be visible in the summary, not only in one detail.
        self.notes.extend(f"task {task.task_id}: {note}" for note in outcome.notes if note.startswith("ignored"))
        return outcome

    def cancelled_outcome(self, task: TaskSpec, reason: str) -> TaskOutcome:
        result = RunResult(task.task_id, status=RunStatus.CANCELLED, error=reason)
        return TaskOutcome(request=self.name, task=task, result=result, passed=False)

    def error_outcome(self, task: TaskSpec, message: str, status: RunStatus = RunStatus.INFERENCE_ERROR) -> TaskOutcome:
        result = RunResult(task.task_id, status=status, error=message)
        return TaskOutcome(request=self.name, task=task, result=result, passed=False)

    async def aclose(self) -> None:
        """Release what the harness and the provider share between tasks.

        A failure belongs to no task: it is a warning and a note of the request's
        summary (:attr:`closing_notes`, which an xdist worker hands its controller).
        """
        harness = self.ctx.harness
        if harness is not None:
            try:
                await call_user(harness.aclose)
            except Exception as exc:
                self._closing_failed("the harness", exc)
        try:
            await self.ctx.provider.aclose()  # its clients (a pool of engines: the containers it still owes)
        except Exception as exc:
            self._closing_failed("the environment", exc)

    def _closing_failed(self, what: str, exc: Exception) -> None:
        note = f"closing {what} failed: {type(exc).__name__}: {exc}"
        log.warning("request %s: %s", self.name, note)
        self.closing_notes.append(note)
        self.notes.append(note)

    # -- finalization ------------------------------------------------------
    async def finalize(self, status: str = "completed") -> dict[str, Any]:
        """Aggregate in task order and write ``summary.json`` and the final ``run_info.json``."""
        # What the provider learned during the run (an engine that stopped answering).
        self.notes.extend(n for n in getattr(self.ctx.provider, "notes", ()) if n not in self.notes)
        ordered = [self.outcomes[t.task_id] for t in self.tasks if t.task_id in self.outcomes]
        benchmark = self.ctx.benchmark
        if type(benchmark).aggregate_metrics is BaseBenchmark.aggregate_metrics:
            # The default only reads scores and statuses, which slim outcomes keep.
            results: Sequence[RunResult] = [o.result for o in ordered]
        else:
            results = StoredResults(ordered)
        try:
            metrics = await call_user(benchmark.aggregate_metrics, results, self.ctx.req)
        except Exception as exc:
            log.warning("request %s: aggregate_metrics failed: %s", self.name, exc)
            metrics = {"error": f"aggregate_metrics failed: {type(exc).__name__}: {exc}"}
        self.metrics = checked_metrics(metrics)
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
                    "resumed": o.resumed,
                }
                for o in ordered
            ],
        }
        self.summary = summary
        try:
            self.store.write_summary(summary)
            self.store.drop_empty_checkpoints()
        except OSError as exc:  # the run directory went read-only or full during the run
            self._unwritten("summary.json", exc)
        self._close_info(status)
        self.finalized = True
        return summary

    def _unwritten(self, name: str, exc: Exception) -> None:
        """``name`` could not be written: said in the summary, and the session fails (plugin/ci.py)."""
        message = f"could not write {name} in {self.store.run_dir}: {type(exc).__name__}: {exc}"
        log.warning("request %s: %s", self.name, message)
        self.notes.append(message)
        self.unwritten.append(name)

    def counts(self) -> dict[str, int]:
        outcomes = list(self.outcomes.values())
        return {
            "tasks": len(outcomes),
            "passed": sum(1 for o in outcomes if o.passed),
            "failed": sum(1 for o in outcomes if not o.passed and not o.result.is_error),
            "errors": sum(1 for o in outcomes if o.result.is_error),
            "environment_errors": sum(1 for o in outcomes if o.result.status is RunStatus.ENVIRONMENT_ERROR),
            "task_errors": sum(1 for o in outcomes if o.result.status is RunStatus.TASK_ERROR),
            "reused": sum(1 for o in outcomes if o.reused),
            "resumed": sum(1 for o in outcomes if o.resumed),
            "retries": sum(o.retries for o in outcomes),
        }

    def stop(self, status: str, reason: str) -> None:
        """Persist the terminal state of a request that did not finish."""
        unfinished = [
            t.task_id
            for t in self.tasks
            if t.task_id in self.wanted
            and (t.task_id not in self.outcomes or self.outcomes[t.task_id].result.status is RunStatus.CANCELLED)
        ]
        self._close_info(status, stop_reason=reason, unfinished_tasks=unfinished)

    def _close_info(self, status: str, **extra: Any) -> None:
        kept = [e for o in self.outcomes.values() if not (o.reused or o.resumed) for e in o.kept_environments]
        self.store.close()
        try:
            self.store.update_run_info(
                status=status,
                finished_at=now(),
                counts=self.counts(),
                notes=self.notes,
                kept_environments=kept,
                with_plans=True,
                **extra,
            )
        except (OSError, ValueError) as exc:  # a full disk must not also keep the lock
            self._unwritten("run_info.json", exc)
        finally:
            release_run_dir(self.store.run_dir)


def _reason(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, AgentCompassError) else f"{type(exc).__name__}: {exc}"


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


def checked_metrics(metrics: Any) -> dict[str, Any]:
    """``aggregate_metrics``' answer as JSON-safe metrics; what cannot be kept is named in ``error``.

    ``summary.json`` must stay JSON (no ``NaN``) and a metric must mean what
    it says (no ``repr`` of an object), so such a value becomes ``None``.
    """
    if not isinstance(metrics, Mapping):
        kind = type(metrics).__name__
        return {"error": f"aggregate_metrics returned {kind}, not a mapping of metric names to values"}
    kept: dict[str, Any] = {}
    problems: list[str] = []
    for key, value in metrics.items():
        name = str(key)
        if isinstance(value, numbers.Integral) and not isinstance(value, bool | int):
            value = int(value)  # numpy's integers, say
        elif isinstance(value, numbers.Real) and not isinstance(value, bool | int | float):
            value = float(value)
        if isinstance(value, float) and not math.isfinite(value):
            problems.append(f"{name!r} is {value}")
            value = None
        elif not _json_safe(value):
            problems.append(f"{name!r} is a {type(value).__name__}, not a number, string or list")
            value = None
        kept[name] = value
    if problems:
        kept["error"] = "aggregate_metrics: " + "; ".join(problems)
    return kept


def _json_safe(value: Any) -> bool:
    if value is None or isinstance(value, str | bool | int):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list | tuple):
        return all(_json_safe(v) for v in value)
    if isinstance(value, Mapping):
        return all(isinstance(k, str) and _json_safe(v) for k, v in value.items())
    return False
