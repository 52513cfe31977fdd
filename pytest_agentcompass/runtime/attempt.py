"""One semantic attempt, with its runtime retries.

Read :meth:`AttemptRunner._attempt` top to bottom: it is the spec's sequence.
Every resource is entered on an ``AsyncExitStack`` the moment it exists, so
the stack closes in owner order (harness session, task Environment, fresh
evaluation Environment) on success, failure and cancellation alike.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import math
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import IO, Any

from ..benchmarks.base import HarnessFreeBenchmark
from ..concurrency.shield import uncancellable
from ..environments.base import EnvironmentSession
from ..vocabulary.artifacts import artifact_sink
from ..vocabulary.errors import TaskSetupError
from ..vocabulary.types import (
    ExecutionPlan,
    NetworkPolicy,
    PreparedTask,
    RunResult,
    RunStatus,
    TaskSpec,
    unserialisable,
)
from .context import RequestContext
from .retry import ErrorKind, RetryBudget, RetryPolicy, RetryScope, Stage, StageFailure, retry_scope
from .traces import format_trace
from .user_code import call_user, maybe_await

__all__ = ["AttemptRecord", "AttemptRunner"]

log = logging.getLogger("pytest_agentcompass")

#: The config key that set each stage's limit, said with its timeout (the stage names are the spec's).
_LIMIT_KEYS = {
    Stage.PREPARATION: " (execution.timeouts.prepare)",
    Stage.INFERENCE: " (execution.timeouts.run)",
    Stage.ARTIFACTS: " (execution.timeouts.artifacts)",
    Stage.EVALUATION: " (execution.timeouts.evaluate)",
}


@dataclass
class AttemptRecord:
    """The terminal try of one semantic attempt and what it left behind."""

    result: RunResult
    retries: int = 0
    cleanup_errors: list[str] = field(default_factory=list)
    kept_environments: list[str] = field(default_factory=list)
    trace: str | None = None
    #: Token usage of tries a runtime retry replaced (their tokens were spent all the same).
    discarded_usage: list[dict[str, Any]] = field(default_factory=list)
    #: Where the latest try's sessions ran (purpose -> e.g. a Docker engine), when the provider chose.
    placement: dict[str, str] = field(default_factory=dict)


class AttemptRunner:
    """Runs attempt ``plan.attempt_index`` of ``task``; retries reuse ``plan``."""

    def __init__(self, ctx: RequestContext, task: TaskSpec, plan: ExecutionPlan) -> None:
        self.ctx = ctx
        self.task = task
        self.plan = plan
        execution = ctx.req.execution
        self.budget = RetryBudget(
            RetryPolicy.of(execution.max_retries, execution.retry_pattern_list, execution.retry_backoff_seconds)
        )
        self.record = AttemptRecord(result=RunResult(task_id=task.task_id))
        self.mode = plan.evaluation_environment_mode

    async def run(self) -> AttemptRecord:
        # A whole-attempt retry leaves the permit block, so it gives the
        # provider permit back and queues for a new one.
        try:
            result = await self._retrying(RetryScope.ATTEMPT, self._attempt_with_permit)
        finally:  # what the provider kept across this attempt's sessions (a snapshot) goes now
            provider, task_id, index = self.ctx.provider, self.task.task_id, self.plan.attempt_index
            await uncancellable(self._cleanup("ending the attempt", lambda: provider.end_attempt(task_id, index)))
        if self.record.placement:
            result = dataclasses.replace(result, metadata={**result.metadata, "placement": self.record.placement})
            try:  # the plan, recorded before anything opened, learns its engines
                self.ctx.store.record_plan(self.plan, placement=self.record.placement)
            except OSError as exc:
                log.warning("task %s: its placement could not be added to plans.jsonl: %s", self.task.task_id, exc)
        self.record.result = result
        return self.record

    async def _attempt_with_permit(self) -> RunResult:
        try:
            async with self.ctx.capacity.permit():
                # save_artifact() from any code of this try, harness or benchmark, lands in its folder.
                with artifact_sink(_AttemptArtifacts(self)):
                    return await self._attempt()
        except StageFailure:
            raise
        except Exception as exc:
            raise StageFailure(Stage.GENERAL, f"{type(exc).__name__}: {exc}", format_trace(exc), cause=exc) from exc

    # -- the sequence ----------------------------------------------------
    async def _attempt(self) -> RunResult:
        ctx, task, plan, req = self.ctx, self.task, self.plan, self.ctx.req
        timeouts = plan.timeouts
        self.record.placement = {}
        async with AsyncExitStack() as stack:
            env = await self._open(stack, "task", Stage.ENVIRONMENT)
            prepared = await self._stage(
                Stage.PREPARATION,
                lambda: call_user(ctx.benchmark.prepare_task, task, env, req, plan.benchmark_plan),
                timeouts.get("prepare"),
            )
            if not isinstance(prepared, PreparedTask):
                raise StageFailure(
                    Stage.PREPARATION,
                    f"prepare_task returned {type(prepared).__name__}, not PreparedTask",
                    kind=ErrorKind.PROGRAMMING,
                )
            result = await self._stage(Stage.INFERENCE, lambda: self._infer(env, prepared), timeouts.get("run"))
            result = self._check_result(result, Stage.INFERENCE)
            if result.is_error:
                # Its kind is what the harness declared, if anything (retry.declared_kind): never
                # read from its text, nor ``environment`` from its status (not the runtime's call).
                raise StageFailure(Stage.INFERENCE_RESULT, result.error or "", payload=result)
            result = await self._stage(
                Stage.ARTIFACTS,
                lambda: call_user(ctx.benchmark.collect_artifacts, task, prepared, result, env, req, plan),
                timeouts.get("artifacts"),
            )
            result = self._check_result(result, Stage.ARTIFACTS)
            if self.mode == "reuse":
                return await self._evaluate_in(env, prepared, result)
        # The task Environment is closed (or retained) before none/fresh evaluation.
        if self.mode == "none":
            return await self._evaluate(prepared, result, None)
        return await self._retrying(RetryScope.EVALUATION_ENVIRONMENT, lambda: self._evaluate_fresh(prepared, result))

    async def _infer(self, env: EnvironmentSession, prepared: PreparedTask) -> Any:
        ctx, task, plan, req = self.ctx, self.task, self.plan, self.ctx.req
        harness = ctx.harness
        if harness is None:
            assert isinstance(ctx.benchmark, HarnessFreeBenchmark)
            await self._switch(env, plan.run_network_policy, Stage.INFERENCE)
            return await call_user(ctx.benchmark.run_task, task, prepared, env, req, plan)
        adjusted = await call_user(harness.adjust_input, task, prepared, req, plan)
        session = await call_user(harness.start_session, task, adjusted, env, req, plan)
        try:
            await self._switch(env, plan.run_network_policy, Stage.INFERENCE)
            return await call_user(harness.run, session, task, adjusted, env, req, plan)
        finally:
            await self._cleanup("closing the harness session", lambda: call_user(harness.close_session, session))

    async def _evaluate_fresh(self, prepared: PreparedTask, result: RunResult) -> RunResult:
        async with AsyncExitStack() as stack:
            env = await self._open(stack, "evaluation", Stage.EVALUATION)
            return await self._evaluate_in(env, prepared, result)

    async def _evaluate_in(self, env: EnvironmentSession, prepared: PreparedTask, result: RunResult) -> RunResult:
        await self._switch(env, self.plan.evaluation_network_policy, Stage.EVALUATION)
        try:
            return await self._evaluate(prepared, result, env)
        finally:
            await uncancellable(
                self._cleanup(
                    "restoring the baseline network policy",
                    lambda: self._switch(env, self.plan.baseline_network_policy),
                )
            )

    async def _evaluate(self, prepared: PreparedTask, result: RunResult, env: EnvironmentSession | None) -> RunResult:
        return await self._retrying(RetryScope.EVALUATE, lambda: self._score(prepared, result, env))

    async def _score(self, prepared: PreparedTask, result: RunResult, env: EnvironmentSession | None) -> RunResult:
        ctx, task, plan, req = self.ctx, self.task, self.plan, self.ctx.req
        scored = await self._stage(
            Stage.EVALUATION,
            lambda: call_user(ctx.benchmark.evaluate, task, prepared, result, req, plan, env=env),
            plan.timeouts.get("evaluate"),
        )
        scored = self._check_result(scored, Stage.EVALUATION)
        if scored.is_error:  # an empty error is no retry pattern's match, not even null's (the spec)
            raise StageFailure(Stage.EVALUATION, scored.error or "", payload=scored)
        problem = _score_problem(scored.score)
        if problem is not None:
            raise StageFailure(Stage.EVALUATION, problem, payload=scored, kind=ErrorKind.MISSING_REWARD)
        return dataclasses.replace(scored, status=RunStatus.SCORED)

    # -- resources ---------------------------------------------------------
    async def _open(self, stack: AsyncExitStack, purpose: Any, stage: Stage) -> EnvironmentSession:
        provider = self.ctx.provider
        config = provider.build_config(self.plan, purpose, self.ctx.labels(self.task, self.plan.attempt_index))
        if purpose == "evaluation" and "task" in self.record.placement:  # beside its task (its image is there)
            config = dataclasses.replace(config, placement=self.record.placement["task"])
        if self.ctx.req.execution.keep_environment:
            config = dataclasses.replace(config, kept=True)
        env: EnvironmentSession = await self._stage(stage, lambda: provider.open(config), kind=ErrorKind.ENVIRONMENT)
        if env.placement:
            self.record.placement[purpose] = env.placement
        if self.ctx.req.execution.keep_environment:
            self.record.kept_environments.append(f"{purpose}: {env.describe()}")
            stack.push_async_callback(self._cleanup, f"releasing the kept {purpose} environment", env.detach)
        else:
            # Described only if closing fails: most sessions close fine.
            stack.push_async_callback(
                self._cleanup, lambda: f"closing the {purpose} environment {env.describe()}", env.close
            )
        return env

    async def _switch(self, env: EnvironmentSession, policy: NetworkPolicy, stage: Stage | None = None) -> None:
        """Switch ``env`` to ``policy``; a failure is the runtime's own Environment call: ``environment``."""
        if env.network_policy == policy:
            return
        if stage is None:  # restoring the baseline: a cleanup step
            await env.set_network_policy(policy)
            return
        await self._stage(stage, lambda: env.set_network_policy(policy), kind=ErrorKind.ENVIRONMENT)

    async def _cleanup(self, what: str | Callable[[], str], action: Callable[[], Awaitable[Any]]) -> None:
        """Run a cleanup step; its failure is a warning, never the task's error."""
        try:
            await action()
        except Exception as exc:
            message = f"{what if isinstance(what, str) else what()}: {type(exc).__name__}: {exc}"
            log.warning("task %s: %s", self.task.task_id, message)
            self.record.cleanup_errors.append(message)

    # -- stages and retries --------------------------------------------------
    async def _stage(
        self, stage: Stage, call: Callable[[], Any], timeout: float | None = None, kind: ErrorKind | None = None
    ) -> Any:
        """Run one stage; any failure becomes a :class:`StageFailure` of ``stage`` (of ``kind`` if given)."""
        limit: asyncio.Timeout | None = None
        try:
            if timeout is None:  # the common case: skip the timeout machinery
                value = call()  # awaited here, not through maybe_await: one coroutine less per stage
                return await value if inspect.isawaitable(value) else value
            async with asyncio.timeout(timeout) as limit:
                return await maybe_await(call())
        except StageFailure:
            raise
        except TimeoutError as exc:
            if limit is not None and limit.expired():  # the plan's own limit, not a wait inside the stage
                message = f"{stage.value} stage timed out after {timeout}s{_LIMIT_KEYS.get(stage, '')}"
            else:
                message = f"TimeoutError: {exc}"
            raise StageFailure(stage, message, trace=format_trace(exc), cause=exc, kind=kind) from exc
        except Exception as exc:
            message = f"{type(exc).__name__}: {exc}"
            trace: str | None = format_trace(exc)
            if isinstance(exc, TaskSetupError):  # the task's own fault, even in the runtime's Environment call
                message, kind, trace = str(exc), ErrorKind.TASK, None  # the message says it all
            raise StageFailure(stage, message, trace=trace, cause=exc, kind=kind) from exc

    def _check_result(self, value: Any, stage: Stage) -> RunResult:
        if not isinstance(value, RunResult):
            raise StageFailure(
                stage, f"{stage.value} stage returned {type(value).__name__}, not RunResult", kind=ErrorKind.PROGRAMMING
            )
        problem = unserialisable(value)
        if problem is None and value.task_id != self.task.task_id:
            # Recorded under the wrong id, a result would be another task's, or no task's.
            problem = f"task_id is {value.task_id!r}, not {self.task.task_id!r}"
        if problem is not None:
            message = f"{stage.value} stage returned a RunResult whose {problem}"
            raise StageFailure(stage, message, kind=ErrorKind.PROGRAMMING)
        return value

    async def _retrying(self, level: RetryScope, body: Callable[[], Awaitable[RunResult]]) -> RunResult:
        """Run ``body``, retrying the failures :data:`RETRY_SCOPE` assigns to ``level``.

        Failures that belong to an outer level pass through; the attempt
        level (the outermost) takes whatever reaches it.
        """
        while True:
            try:
                return await body()
            except StageFailure as failure:
                if level is not RetryScope.ATTEMPT and retry_scope(failure.stage, self.mode) is not level:
                    raise
                if not await self._may_retry(failure, level):
                    return self._give_up(failure)

    async def _may_retry(self, failure: StageFailure, scope: RetryScope) -> bool:
        payload = failure.payload
        reason = self.budget.take(failure)
        if reason is None:
            return False
        if isinstance(payload, RunResult) and isinstance(payload.metadata.get("usage"), dict):
            self.record.discarded_usage.append(payload.metadata["usage"])
        self.record.retries += 1
        payload = failure.payload.to_dict() if isinstance(failure.payload, RunResult) else failure.payload
        self.ctx.store.save_retry_detail(
            self.task.task_id,
            self.plan.attempt_index,
            self.record.retries,
            {
                "task_id": self.task.task_id,
                "attempt_index": self.plan.attempt_index,
                "retry_number": self.record.retries,
                "stage": failure.stage.value,
                "scope": scope.value,
                "error_kind": failure.kind.value,
                "matched_pattern": reason,
                "error": failure.error,
                "trace": failure.trace,
                "payload": payload,
                "plan": self.plan.to_dict(),
                "placement": dict(self.record.placement),
            },
        )
        self.ctx.events.on_retry(self.task.task_id, failure.stage.value)
        await asyncio.sleep(self.budget.delay())
        return True

    def _give_up(self, failure: StageFailure) -> RunResult:
        """The terminal error result once retries are exhausted; keeps the trace.

        A returned error result keeps its status, unless it claims one only the
        runtime gives (an infrastructure fault, a cancellation): that is
        replaced by the stage's own, and the claim kept as ``returned_status``.
        """
        if failure.kind is ErrorKind.ENVIRONMENT:
            status = RunStatus.ENVIRONMENT_ERROR
        elif failure.kind is ErrorKind.TASK:
            status = RunStatus.TASK_ERROR
        elif failure.stage is Stage.EVALUATION:
            status = RunStatus.EVALUATION_ERROR
        else:
            status = RunStatus.INFERENCE_ERROR
        base = failure.payload if isinstance(failure.payload, RunResult) else RunResult(task_id=self.task.task_id)
        self.record.trace = failure.trace
        metadata = {**base.metadata, "failure_stage": failure.stage.value, "error_kind": failure.kind.value}
        if base.is_error and base.status not in _RUNTIME_STATUSES:
            status = base.status
        elif base.is_error and base.status is not status:
            metadata["returned_status"] = base.status.value
        error = failure.error or f"the {failure.stage.value} stage returned a {status.value} result with no error text"
        return dataclasses.replace(base, status=status, error=error, score=None, metadata=metadata)


#: Error statuses only the runtime gives: a component's result that claims one is not believed.
_RUNTIME_STATUSES = frozenset({RunStatus.ENVIRONMENT_ERROR, RunStatus.CANCELLED})


def _score_problem(score: Any) -> str | None:
    """Why ``score`` cannot be a task's score, or ``None`` when it is a finite number."""
    if score is None:
        return "evaluate returned a result without a score"
    if isinstance(score, bool) or not isinstance(score, int | float):
        return f"evaluate returned a score of type {type(score).__name__} ({score!r}), not a number"
    try:
        finite = math.isfinite(score)
    except OverflowError:  # an int past a float's range
        finite = False
    if not finite:
        return f"evaluate returned a score of {_cut(repr(score))}, not a finite number"
    return None


def _cut(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


class _AttemptArtifacts:
    """The artifact sink of one try: files land under the task's attempt (and retry) folder."""

    def __init__(self, runner: AttemptRunner) -> None:
        self.runner = runner

    def save(self, name: str, data: Any) -> str:
        runner = self.runner
        # The try in progress now: an evaluation retried within this try counts as a retry too.
        retry = runner.record.retries
        return runner.ctx.store.component_files.save_artifact(
            runner.task.task_id, runner.plan.attempt_index, retry, name, data
        )

    def save_stream(self, name: str, handle: IO[bytes], limit: int) -> tuple[str, int]:
        runner = self.runner
        return runner.ctx.store.component_files.save_artifact_stream(
            runner.task.task_id, runner.plan.attempt_index, runner.record.retries, name, handle, limit
        )
