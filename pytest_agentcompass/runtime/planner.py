"""The Planner: one :class:`ExecutionPlan` per semantic attempt.

Mode resolution, per-phase network policies and timeouts are decided here,
then matching recipes adjust the plan within the fields they declare.
"""

from __future__ import annotations

import dataclasses
import inspect
import numbers
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..vocabulary.errors import ComponentError
from ..vocabulary.protocols import Recipe
from ..vocabulary.types import EVALUATION_MODES, EvaluationMode, ExecutionPlan, TaskSpec
from .user_code import call_user

if TYPE_CHECKING:
    from ..benchmarks.base import BaseBenchmark
    from ..config import RunRequest
    from ..environments.base import BaseEnvironment
    from ..harnesses.base import BaseHarness

__all__ = ["BenchmarkPlanError", "Planner", "Recipe", "resolve_evaluation_mode"]


class BenchmarkPlanError(Exception):
    """``make_benchmark_plan`` raised, or a planning hook returned no plan: the
    benchmark's fault, reported by the task it hit."""


def resolve_evaluation_mode(req: RunRequest, task: TaskSpec, benchmark: BaseBenchmark) -> EvaluationMode:
    """Request setting > task setting > benchmark default."""
    mode: Any = (
        req.environment.evaluation_environment_mode
        or task.evaluation_environment_mode
        or benchmark.resolve_evaluation_environment_mode(req)
    )
    if mode not in EVALUATION_MODES:
        raise ComponentError(
            f"task {task.task_id!r}: evaluation mode {mode!r} is not one of {', '.join(EVALUATION_MODES)}"
        )
    return mode  # type: ignore[no-any-return]


class Planner:
    """Builds and validates the plans of one request."""

    def __init__(
        self,
        req: RunRequest,
        benchmark: BaseBenchmark,
        provider: BaseEnvironment,
        recipes: Sequence[Recipe] = (),
        harness: BaseHarness | None = None,
    ) -> None:
        self.req = req
        self.benchmark = benchmark
        self.provider = provider
        self.recipes = list(recipes)
        # Only a harness that overrides adjust_plan is called (the default would cost a thread hop per plan).
        self.harness = harness if harness is not None and _overrides_adjust_plan(harness) else None
        # Dumped once: the request's timeouts are the same for every plan (each plan gets its own copy).
        self._timeouts = req.execution.timeouts.model_dump()

    async def plan(self, task: TaskSpec, attempt_index: int) -> ExecutionPlan:
        """A new plan for attempt ``attempt_index`` of ``task``.

        The benchmark's planning hooks go through :func:`call_user` like every
        lifecycle method: a sync one runs off the loop (a slow one leaves other
        tasks running, and the deadline or Ctrl-C still ends the run), an
        async one is awaited.

        :raises BenchmarkPlanError: if ``make_benchmark_plan`` raises, or a hook returns no plan.
        :raises PolicyError: if the provider cannot honour the plan's policies.
        :raises ComponentError: if a recipe oversteps its declared fields.
        """
        req = self.req
        network = req.environment.network
        try:
            benchmark_plan = await call_user(self.benchmark.make_benchmark_plan, task, req)
        except Exception as exc:
            raise BenchmarkPlanError(f"make_benchmark_plan raised {type(exc).__name__}: {exc}") from exc
        if benchmark_plan is not None and inspect.isawaitable(benchmark_plan):
            # It would be recorded as "<coroutine object ...>" and never run.
            raise BenchmarkPlanError(f"make_benchmark_plan returned {_kind(benchmark_plan)}, not plan data")
        plan = ExecutionPlan(
            task_id=task.task_id,
            attempt_index=attempt_index,
            evaluation_environment_mode=resolve_evaluation_mode(req, task, self.benchmark),
            baseline_network_policy=network.baseline,
            run_network_policy=network.run or network.baseline,
            evaluation_network_policy=network.evaluation or network.baseline,
            timeouts=dict(self._timeouts),
            benchmark_plan=benchmark_plan,
            components={
                "benchmark": req.benchmark.id,
                "harness": req.harness.id,
                "environment": req.environment.id,
                **({"model": req.model.id} if req.model else {}),
            },
        )
        plan = await _adjusted(self.benchmark.adjust_plan, plan, task, req, "adjust_plan")
        if self.harness is not None:
            plan = await _adjusted(self.harness.adjust_plan, plan, task, req, "the harness's adjust_plan")
        for recipe in self.recipes:
            if recipe.matches(req, task):
                plan = self._apply(recipe, plan, task)
        self.provider.validate_plan(plan)
        return plan

    def _apply(self, recipe: Recipe, plan: ExecutionPlan, task: TaskSpec) -> ExecutionPlan:
        adjusted = recipe.adjust(plan, self.req, task)
        changed = {
            f.name
            for f in dataclasses.fields(plan)
            if f.name != "recipes" and getattr(plan, f.name) != getattr(adjusted, f.name)
        }
        illegal = changed - set(recipe.overrides)
        if illegal:
            raise ComponentError(
                f"recipe {recipe.name!r} changed plan fields it does not declare: {', '.join(sorted(illegal))} "
                f"(declared: {', '.join(sorted(recipe.overrides)) or 'none'})"
            )
        if adjusted.evaluation_environment_mode not in EVALUATION_MODES:
            raise ComponentError(f"recipe {recipe.name!r} set evaluation mode {adjusted.evaluation_environment_mode!r}")
        _check_timeouts(plan, adjusted, f"recipe {recipe.name!r}")
        return dataclasses.replace(adjusted, recipes=(*plan.recipes, recipe.name))


async def _adjusted(
    hook: Callable[[ExecutionPlan, TaskSpec, RunRequest], Any],
    plan: ExecutionPlan,
    task: TaskSpec,
    req: RunRequest,
    source: str,
) -> ExecutionPlan:
    """``hook``'s adjustment of ``plan`` (the benchmark's or the harness's ``adjust_plan``), checked."""
    try:
        adjusted = await call_user(hook, plan, task, req)
    except Exception as exc:
        raise BenchmarkPlanError(f"{source} raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(adjusted, ExecutionPlan):
        raise BenchmarkPlanError(f"{source} returned {_kind(adjusted)}, not an ExecutionPlan")
    _check_timeouts(plan, adjusted, source)
    return adjusted


def _overrides_adjust_plan(harness: BaseHarness) -> bool:
    from ..harnesses.base import BaseHarness

    return type(harness).adjust_plan is not BaseHarness.adjust_plan


def _kind(value: object) -> str:
    """What a hook returned, for its error: "a coroutine", "a dict", "None"."""
    if inspect.iscoroutine(value):
        value.close()  # refused, never to run: no "was never awaited" warning on top of the error
        return "a coroutine"
    return "None" if value is None else f"a {type(value).__name__}"


def _check_timeouts(before: ExecutionPlan, after: ExecutionPlan, source: str) -> None:
    """The config refuses a timeout that is not a positive number; a hook or recipe may not slip one in.

    (A negative one timed every stage out at once, a string failed deep in asyncio.)
    Only what ``source`` changed is its doing; ``inf`` is no limit, as in the config.
    """
    for stage, seconds in after.timeouts.items():
        if seconds is None or before.timeouts.get(stage, None) is seconds:
            continue
        if isinstance(seconds, bool) or not isinstance(seconds, numbers.Real) or not seconds > 0:
            raise BenchmarkPlanError(
                f"{source} set timeouts[{stage!r}] to {seconds!r}; a timeout is a positive number of seconds or None"
            )
