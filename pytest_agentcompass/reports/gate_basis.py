"""What a request's gates judge: every task of the request, whatever this session selected.

A gate is a verdict on the request, not on a selection: under ``-k``, ``-m``
or ``--lf`` a session runs some of its tasks, and a verdict on those alone
would let a selection of passing tasks (or a ``--lf`` that reruns only the
errors) turn a missed gate green. So each task of the request contributes
its newest result: this session's (its run directory, resumed and carried-over
tasks included), else the newest one an earlier run of the request with the
same settings recorded (*carried over*; a cancelled try is no result). A
task with no result anywhere is left out and named.

A task that ended in an error counts as a failed task scoring 0
(``gate_errors: fail``, the default), or is left out (``gate_errors:
exclude``): judged over the scored tasks alone, an agent that breaks the
tasks it would fail raises the score.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..benchmarks.base import BaseBenchmark
from ..runtime.store import RunStore
from ..runtime.store.runs import iter_runs
from ..runtime.summary import StoredResults, checked_metrics
from ..runtime.task import outcome_from_detail
from ..runtime.user_code import call_user
from ..vocabulary.outcome import TaskOutcome
from ..vocabulary.types import RunResult, RunStatus, TaskSpec
from .gate_check import GateCheck, check_gates

if TYPE_CHECKING:
    from ..config import RunRequest

__all__ = ["GateVerdict", "judge_request"]


@dataclass(frozen=True)
class GateVerdict:
    """The gates of one request, the metrics they judged, and what those metrics cover."""

    check: GateCheck
    metrics: Mapping[str, Any]
    gate_errors: str
    tasks: int  # tasks of the request
    this_run: int  # results from this session's run directory
    carried_over: int  # results from earlier runs
    errored: int  # judged results that are errors
    sources: list[str] = field(default_factory=list)  # the run directories carried over from
    missing: list[str] = field(default_factory=list)  # tasks with no result anywhere
    #: This session's tasks cancelled when the run was interrupted: the verdict is on an unfinished run.
    cancelled: int = 0
    #: Why they were (``interrupted by the user``, ``terminated by a SIGTERM``, a timeout).
    cancel_reason: str = ""

    @property
    def passed(self) -> bool:
        return self.check.passed

    def basis(self) -> str:
        """One line: which results the verdict rests on."""
        judged = self.this_run + self.carried_over
        parts = [f"judged on {judged} of {self.tasks} task(s)"]
        if self.cancelled:
            why = f" ({self.cancel_reason})" if self.cancel_reason else ""
            parts.insert(0, f"the run was interrupted{why}: {self.cancelled} task(s) cancelled before they finished")
        if self.carried_over:
            more = len(self.sources) - 3
            shown = ", ".join(self.sources[:3]) + (f" and {more} more" if more > 0 else "")
            parts.append(f"{self.this_run} from this session, {self.carried_over} carried over from {shown}")
        if self.missing:
            names = ", ".join(self.missing[:5]) + (" ..." if len(self.missing) > 5 else "")
            parts.append(f"{len(self.missing)} with no result in this session or an earlier run ({names})")
        if self.errored:
            how = "counted as failed, score 0" if self.gate_errors == "fail" else "left out (gate_errors: exclude)"
            parts.append(f"{self.errored} errored task(s) {how}")
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """The ``gates`` entry of ``summary.json``."""
        return {
            "met": self.passed,
            "missed": list(self.check.missed),
            "ok": list(self.check.met),
            "metrics": dict(self.metrics),
            "gate_errors": self.gate_errors,
            "tasks": self.tasks,
            "this_run": self.this_run,
            "carried_over": self.carried_over,
            "carried_over_from": list(self.sources),
            "missing": list(self.missing),
            "errored": self.errored,
            "cancelled": self.cancelled,
        }


def judge_request(
    req: RunRequest,
    benchmark: Any,
    tasks: Sequence[TaskSpec],
    outcomes: Mapping[str, TaskOutcome],
    *,
    request_dir: Path,
    current: Path | None,
    fingerprint: Callable[[TaskSpec], str],
    request_fingerprint: str,
    metrics: Mapping[str, Any] | None = None,
) -> GateVerdict | None:
    """The gates of ``req`` judged over every task of the request (see the module docstring).

    :param outcomes: this session's outcomes by task id (its run directory: ``current``).
    :param metrics: what finalization aggregated from ``outcomes``, used as is when they are
        the whole basis and the default aggregation already counts errors as failures.
    :returns: ``None`` when no task of the request has a result anywhere.
    """
    default = type(benchmark).aggregate_metrics is BaseBenchmark.aggregate_metrics
    entries = {t.task_id: outcomes[t.task_id] for t in tasks if t.task_id in outcomes}
    this_run = len(entries)
    sources = _carry_over(req.name, tasks, entries, request_dir, current, fingerprint, request_fingerprint)
    if not entries:
        return None
    ordered = [entries[t.task_id] for t in tasks if t.task_id in entries]
    errored = sum(1 for o in ordered if o.result.is_error)
    whole = this_run == len(entries) == len(tasks)
    if whole and metrics is not None and default and (req.gate_errors == "fail" or not errored):
        judged: Mapping[str, Any] = metrics
    else:
        view = _judged_view(ordered, req.gate_errors, default)
        # The default reads what slim outcomes keep; a custom aggregation each whole detail, when it asks.
        results: Sequence[RunResult] = [o.result for o in view] if default else StoredResults(view)
        judged = _aggregate(benchmark, req, results)
    cancelled = [o for o in outcomes.values() if o.result.status is RunStatus.CANCELLED]
    return GateVerdict(
        check=check_gates(req.name, req.gates, judged),
        metrics=judged,
        gate_errors=req.gate_errors,
        tasks=len(tasks),
        this_run=this_run,
        carried_over=len(entries) - this_run,
        errored=errored,
        sources=sources,
        missing=[t.task_id for t in tasks if t.task_id not in entries],
        cancelled=len(cancelled),
        cancel_reason=str(cancelled[0].result.error or "") if cancelled else "",
    )


def _carry_over(
    request: str,
    tasks: Sequence[TaskSpec],
    entries: dict[str, TaskOutcome],
    request_dir: Path,
    current: Path | None,
    fingerprint: Callable[[TaskSpec], str],
    request_fingerprint: str,
) -> list[str]:
    """Fill ``entries`` for the tasks without one from earlier runs, newest first; the runs used."""
    wanted = {t.task_id: t for t in tasks if t.task_id not in entries}
    sources: list[str] = []
    if not wanted:
        return sources
    for run_dir, info in iter_runs(request_dir):
        if run_dir == current or info.get("fingerprint") != request_fingerprint:
            continue
        store = RunStore(run_dir)
        found = 0
        for name in list(wanted):
            detail = store.read_detail(name)  # none, or cut short by a kill
            task = wanted[name]
            if detail is None or detail.get("fingerprint") != fingerprint(task):
                continue
            outcome = outcome_from_detail(request, task, detail, store.detail_file(name))
            if outcome.result.status is RunStatus.CANCELLED:
                continue  # an interrupted try is no result: look further back
            outcome.slim()  # the detail stays on disk; a custom aggregation reads it from there
            entries[name] = outcome
            del wanted[name]
            found += 1
        if found:
            sources.append(str(run_dir))
        if not wanted:
            break
    return sources


def _judged_view(ordered: list[TaskOutcome], gate_errors: str, default: bool) -> list[TaskOutcome]:
    """The outcomes as the gates count them: errors left out, or errors as failed tasks scoring 0."""
    if gate_errors == "exclude":
        return [o for o in ordered if not o.result.is_error]
    if default:
        return ordered  # the default aggregation counts an error as a failure scoring 0 itself
    return [_as_failure(o) if o.result.is_error else o for o in ordered]


def _as_failure(outcome: TaskOutcome) -> TaskOutcome:
    failed = RunResult(outcome.result.task_id, score=0.0, status=RunStatus.SCORED)
    return dataclasses.replace(outcome, result=failed, detail_path=None)  # not read back from its detail


def _aggregate(benchmark: Any, req: RunRequest, results: Sequence[RunResult]) -> Mapping[str, Any]:
    """``aggregate_metrics`` over ``results``, as finalization calls it, from any thread."""

    async def aggregate() -> Any:
        return await call_user(benchmark.aggregate_metrics, results, req)

    try:
        asyncio.get_running_loop()
    except RuntimeError:  # no loop here (the main thread after the tasks): the usual case
        answer = _safely(lambda: asyncio.run(aggregate()))
    else:  # called from inside a running loop (a request finalized mid-run): a loop of its own
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="agentcompass-gates") as pool:
            answer = _safely(lambda: pool.submit(asyncio.run, aggregate()).result())
    return checked_metrics(answer)


def _safely(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception as exc:  # named among the metrics: a gate on them then fails, saying why
        return {"error": f"aggregate_metrics failed: {type(exc).__name__}: {exc}"}
