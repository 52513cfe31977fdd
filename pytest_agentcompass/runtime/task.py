"""One task: its semantic attempts, checkpoints, analysis and terminal record."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ..analyzers.base import select_analyzers
from ..models.usage import sum_usage
from ..vocabulary.outcome import TaskOutcome
from ..vocabulary.types import RunResult, RunStatus, TaskSpec
from .attempt import AttemptRecord, AttemptRunner
from .context import RequestContext
from .integrity import enforce, merge_attempts
from .planner import BenchmarkPlanError
from .strategies import AttemptScheduler
from .traces import format_trace
from .user_code import call_user

__all__ = ["TaskOutcome", "outcome_from_detail", "run_attempts"]

log = logging.getLogger("pytest_agentcompass")
_EMPTY: Mapping[str, Any] = MappingProxyType({})


async def run_attempts(ctx: RequestContext, task: TaskSpec) -> TaskOutcome:
    """Run the missing attempts of ``task`` and write its detail record."""
    started = time.monotonic()
    execution = ctx.req.execution
    fingerprint = ctx.task_fingerprint(task)
    if task.broken is not None:
        return _broken(ctx, task, fingerprint, started)
    scheduler = AttemptScheduler(ctx.strategy, execution.attempts.k, execution.pass_threshold)
    restored, ignored = ctx.store.load_checkpoints(task.task_id, fingerprint)
    scheduler.restore(restored)
    notes: list[str] = []
    if restored:
        notes.append(f"restored attempts {sorted(restored)} from checkpoints")
    if ignored:
        notes.append(f"ignored {ignored} incompatible checkpoint(s): the config or task changed")
    records: dict[int, AttemptRecord] = {}
    modes: set[str] = set()
    while (index := scheduler.next_index()) is not None:
        ctx.events.on_attempt_start(task.task_id, index)
        try:
            plan = await ctx.planner.plan(task, index)
        except Exception as exc:  # a plan that cannot be built fails the attempt, not the run
            record = AttemptRecord(
                result=RunResult(
                    task.task_id,
                    status=RunStatus.INFERENCE_ERROR,
                    error=f"planning attempt {index} failed: "
                    + (str(exc) if isinstance(exc, BenchmarkPlanError) else f"{type(exc).__name__}: {exc}"),
                ),
                # A hook's own exception (BenchmarkPlanError names the hook): its trace, not the planner's.
                trace=format_trace(exc.__cause__ if isinstance(exc, BenchmarkPlanError) and exc.__cause__ else exc),
            )
        else:
            modes.add(plan.evaluation_environment_mode)
            ctx.store.record_plan(plan)
            record = await AttemptRunner(ctx, task, plan).run()
        records[index] = record
        scheduler.record(index, record.result)
        if execution.attempts.k > 1:
            ctx.store.save_checkpoint(task.task_id, index, fingerprint, record.result)
    result = _task_usage(scheduler.combine(), scheduler.done, records)
    # Findings of every attempt stay with the task; ``strict`` makes them its error.
    result = enforce(merge_attempts(result, scheduler.done), execution.integrity)
    # What a component wants said about the task (metadata["notes"]: lines) is said with it.
    notes += [n for n in result.metadata.get("notes") or [] if isinstance(n, str) and n not in notes]
    try:
        # bytes (a binary artifact) become files of the run; the detail records their paths.
        result = ctx.store.externalize_bytes(task.task_id, result)
        done = {
            i: ctx.store.externalize_bytes(task.task_id, r, f"attempt-{i}" if execution.attempts.k > 1 else "")
            for i, r in scheduler.done.items()
        }
    except OSError as exc:
        log.warning("task %s: binary artifacts could not be written: %s", task.task_id, exc)
        done = dict(scheduler.done)
    analysis, analysis_errors = await _analyze(ctx, task, result)
    passed = not result.is_error and result.score is not None and result.score >= execution.pass_threshold
    outcome = TaskOutcome(
        request=ctx.req.name,
        task=task,
        result=result,
        passed=passed,
        evaluation_environment_mode=",".join(sorted(modes)),
        attempts=len(scheduler.done),
        retries=sum(r.retries for r in records.values()),
        cleanup_errors=[e for r in records.values() for e in r.cleanup_errors],
        kept_environments=[e for r in records.values() for e in r.kept_environments],
        notes=notes,
        trace=next((r.trace for r in reversed(records.values()) if r.trace), None),
        duration=time.monotonic() - started,
    )
    detail = _detail(ctx, outcome, fingerprint, done, analysis, analysis_errors)
    try:
        # A field cut to the store's limit is said with the task's report, as in its detail.
        outcome.detail_path = ctx.store.save_partial_result(task.task_id, detail, notes=outcome.notes)
    except OSError as exc:
        # The score is known: report and summarize it, and say that a resume will run the task again.
        outcome.storage_error = f"its detail record could not be written, so a resume runs it again: {exc}"
    return outcome


def _broken(ctx: RequestContext, task: TaskSpec, fingerprint: str, started: float) -> TaskOutcome:
    """A task the benchmark declared broken: its ``task_error``, recorded, with nothing opened or retried."""
    result = RunResult(task.task_id, status=RunStatus.TASK_ERROR, error=task.broken)
    outcome = TaskOutcome(
        request=ctx.req.name, task=task, result=result, passed=False, duration=time.monotonic() - started
    )
    try:
        outcome.detail_path = ctx.store.save_partial_result(
            task.task_id, _detail(ctx, outcome, fingerprint, {}, {}, {})
        )
    except OSError as exc:
        outcome.storage_error = f"its detail record could not be written, so a resume runs it again: {exc}"
    return outcome


def _task_usage(result: RunResult, done: Mapping[int, RunResult], records: Mapping[int, AttemptRecord]) -> RunResult:
    """Token usage for the whole task: every attempt, and every try a retry replaced.

    A strategy keeps one attempt's metadata; the tokens of the others were spent too.
    """
    parts = [r.metadata.get("usage") for r in done.values()]
    parts += [usage for record in records.values() for usage in record.discarded_usage]
    total = sum_usage(parts)
    if total is None:
        return result
    del total["tasks"]
    if total == result.metadata.get("usage"):
        return result
    return dataclasses.replace(result, metadata={**result.metadata, "usage": total})


async def _analyze(ctx: RequestContext, task: TaskSpec, result: RunResult) -> tuple[dict[str, Any], dict[str, str]]:
    findings: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for analyzer in select_analyzers(ctx.analyzers, task, result, ctx.req):
        name = analyzer.name or type(analyzer).__name__
        try:
            findings[name] = await call_user(analyzer.analyze, task, result, ctx.req)
        except Exception as exc:  # recorded beside the score, never instead of it
            log.warning("task %s: analyzer %s failed: %s", task.task_id, name, exc)
            errors[name] = f"{type(exc).__name__}: {exc}"
    return findings, errors


def _detail(
    ctx: RequestContext,
    outcome: TaskOutcome,
    fingerprint: str,
    attempts: dict[int, RunResult],
    analysis: dict[str, Any],
    analysis_errors: dict[str, str],
) -> dict[str, Any]:
    req = ctx.req
    return {
        "task_id": outcome.task.task_id,
        "request": req.name,
        "category": outcome.task.category,
        # What identifies the task, as the benchmark loaded it (harbor: its folder, its real name):
        # the plain values only, not whole tables (a task.toml the task's folder keeps anyway).
        "task_metadata": {
            k: v for k, v in outcome.task.metadata.items() if v is None or isinstance(v, str | int | float | bool)
        },
        "fingerprint": fingerprint,
        "passed": outcome.passed,
        **outcome.result.to_dict(),
        "evaluation_environment_mode": outcome.evaluation_environment_mode,
        "attempts": outcome.attempts,
        "attempt_results": {str(i): r.to_dict() for i, r in sorted(attempts.items())},
        "retries": outcome.retries,
        "trace": outcome.trace,
        "cleanup_errors": outcome.cleanup_errors,
        "kept_environments": outcome.kept_environments,
        "analysis": analysis,
        "analysis_errors": analysis_errors,
        # The judge's params may hold ${VAR} values: mask short ones whole, too.
        "judge": ctx.store.redactor.apply(req.judge.model_dump(mode="json"), whole_values=True) if req.judge else None,
        "notes": outcome.notes,
        "duration": round(outcome.duration, 4),
    }


def outcome_from_detail(
    request: str, task: TaskSpec, detail: dict[str, Any], path: str | Path, *, resumed: bool = False
) -> TaskOutcome:
    """Rebuild a :class:`TaskOutcome` from a recorded detail (carried over, or resumed)."""
    result = RunResult.from_dict(detail)
    return TaskOutcome(
        request=request,
        task=task,
        result=result,
        passed=bool(detail.get("passed")),
        # "evaluation_mode": the key's name in details written before it took the spec's name.
        evaluation_environment_mode=str(detail.get("evaluation_environment_mode", detail.get("evaluation_mode", ""))),
        attempts=int(detail.get("attempts", 0)),
        retries=int(detail.get("retries", 0)),
        cleanup_errors=list(detail.get("cleanup_errors") or []),
        kept_environments=list(detail.get("kept_environments") or []),
        trace=detail.get("trace"),
        duration=float(detail.get("duration", 0.0)),
        detail_path=str(path),
        carried_over=not resumed,
        resumed=resumed,
    )
