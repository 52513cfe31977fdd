"""A request's summary: counts, metrics from ``aggregate_metrics``, and the value reports read.

Aggregation reads results in task order without holding them all in memory
(:class:`StoredResults`), and keeps ``summary.json`` JSON and meaningful
(:func:`checked_metrics`). :class:`RequestSummary` is what the terminal
summary is given: values, never the live runtime.
"""

from __future__ import annotations

import logging
import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

from ..benchmarks.base import BaseBenchmark
from ..models.usage import sum_usage
from ..vocabulary.types import RunResult, RunStatus, TaskSpec, TaskState
from .context import RequestContext
from .integrity import findings, flagged
from .store.details import read_detail_file
from .store.journal import Journal
from .task import TaskOutcome
from .user_code import call_user

__all__ = [
    "RequestSummary",
    "StoredResults",
    "aggregate",
    "checked_metrics",
    "count_outcomes",
    "summary_record",
]

log = logging.getLogger("pytest_agentcompass")

#: Token totals of a request (``models.usage.sum_usage``), or ``None`` when no task called a model.
Usage = dict[str, Any] | None


@dataclass(frozen=True)
class RequestSummary:
    """One request at the end of a session, as the terminal summary shows it."""

    name: str
    run_dir: Path
    counts: Mapping[str, int]
    #: Why the request ran nothing (its preflight or preparation failed).
    failed: str | None = None
    metrics: Mapping[str, Any] | None = None
    #: Token totals of model-calling harnesses.
    usage: Mapping[str, Any] | None = None
    notes: Sequence[str] = ()
    #: ``(task id, environment)`` of each session this run kept open (``keep_environment: true``).
    kept_environments: Sequence[tuple[str, str]] = ()
    #: ``(task id, findings)`` of each task with integrity findings, in task order.
    flagged: Sequence[tuple[str, Sequence[Mapping[str, Any]]]] = ()


def count_outcomes(outcomes: Iterable[TaskOutcome]) -> dict[str, int]:
    """The counts ``summary.json``, ``run_info.json`` and the terminal summary show."""
    counts = dict.fromkeys(
        (
            "tasks",
            "passed",
            "failed",
            "errors",
            "environment_errors",
            "task_errors",
            "integrity_flagged",
            "carried_over",
            "resumed",
            "retries",
        ),
        0,
    )
    for outcome in outcomes:
        state = TaskState.of(outcome.result.status, outcome.passed)
        counts["tasks"] += 1
        counts["passed"] += state is TaskState.PASSED
        counts["failed"] += state is TaskState.FAILED
        counts["errors"] += state is TaskState.ERROR
        counts["environment_errors"] += outcome.result.status is RunStatus.ENVIRONMENT_ERROR
        counts["task_errors"] += outcome.result.status is RunStatus.TASK_ERROR
        counts["integrity_flagged"] += flagged(outcome.result)
        counts["carried_over"] += outcome.carried_over
        counts["resumed"] += outcome.resumed
        counts["retries"] += outcome.retries
    return counts


def flagged_tasks(
    tasks: Iterable[TaskSpec], outcomes: Mapping[str, TaskOutcome]
) -> list[tuple[str, list[dict[str, Any]]]]:
    """Each task with integrity findings (in task order), with its findings."""
    out = []
    for task in tasks:
        outcome = outcomes.get(task.task_id)
        if outcome is not None and flagged(outcome.result):
            out.append((task.task_id, findings(outcome.result)))
    return out


def summary_record(outcome: TaskOutcome) -> dict[str, Any]:
    """One task's line in ``summary.json``."""
    return {
        "task_id": outcome.task.task_id,
        "status": outcome.result.status.value,
        "score": outcome.result.score,
        "passed": outcome.passed,
        "carried_over": outcome.carried_over,
        "resumed": outcome.resumed,
    }


async def aggregate(
    ctx: RequestContext, ordered: Sequence[TaskOutcome]
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The request's metrics (``aggregate_metrics`` over ``ordered``, checked) and its token usage."""
    benchmark = ctx.benchmark
    if type(benchmark).aggregate_metrics is BaseBenchmark.aggregate_metrics:
        # The default only reads scores and statuses, which slim outcomes keep.
        results: Sequence[RunResult] = [o.result for o in ordered]
    else:
        results = StoredResults(ordered)
    try:
        metrics = await call_user(benchmark.aggregate_metrics, results, ctx.req)
    except Exception as exc:
        log.warning("request %s: aggregate_metrics failed: %s", ctx.req.name, exc)
        metrics = {"error": f"aggregate_metrics failed: {type(exc).__name__}: {exc}"}
    return checked_metrics(metrics), sum_usage(o.result.metadata.get("usage") for o in ordered)


class StoredResults(Sequence[RunResult]):
    """Terminal results in task order, read back from their detail files one at a time.

    Finalization hands this to ``aggregate_metrics`` so that memory does not
    grow with outputs, artifacts and evidence of every task in the request.
    """

    def __init__(self, outcomes: Sequence[TaskOutcome]) -> None:
        self._outcomes = list(outcomes)
        #: The journals read so far (``details_layout: journal``), each indexed once.
        self._journals: dict[str, Journal] = {}

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

    def _load(self, outcome: TaskOutcome) -> RunResult:
        if outcome.detail_path is not None:
            detail = read_detail_file(outcome.detail_path, self._journals)  # None unless a record from_dict takes
            if detail is not None:
                return RunResult.from_dict(detail)
        return outcome.result  # what is in memory


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
