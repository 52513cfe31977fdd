"""Building a request's components and loading its tasks (once per request)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .analysis import BaseAnalyzer
from .benchmark import BaseBenchmark, HarnessFreeBenchmark
from .config import SAFE_NAME, ComponentRef, RunRequest
from .environments.base import BaseEnvironment
from .errors import ComponentError, TaskIdError
from .harnesses.base import BaseHarness
from .registry import ComponentKind, Registry
from .runtime.planner import Planner, Recipe
from .runtime.strategies import AttemptStrategy
from .types import TaskSpec

__all__ = ["RequestSetup", "build_request", "validate_task_ids"]


@dataclass
class RequestSetup:
    """A request's instantiated components and its selected tasks."""

    index: int
    req: RunRequest
    benchmark: BaseBenchmark
    harness: BaseHarness | None
    provider: BaseEnvironment
    strategy: AttemptStrategy
    analyzers: list[BaseAnalyzer] = field(default_factory=list)
    recipes: list[Recipe] = field(default_factory=list)
    tasks: list[TaskSpec] = field(default_factory=list)

    def planner(self) -> Planner:
        return Planner(self.req, self.benchmark, self.provider, self.recipes)


def _run_sync(value: Any) -> Any:
    # Collection happens outside any event loop: async load/select run here.
    if inspect.isawaitable(value):

        async def wait() -> Any:
            return await value

        return asyncio.run(wait())
    return value


def _instantiate(registry: Registry, kind: ComponentKind, ref: ComponentRef, where: str, base: type, *args: Any) -> Any:
    """Resolve ``ref`` and build it: ``cls(*args)`` when given, else ``cls(**ref.params)``."""
    cls = registry.resolve(kind, ref.id, where)
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise ComponentError(f"{kind} {ref.id!r} ({where}) is not a subclass of {base.__name__}")
    try:
        return cls(*args) if args else cls(**ref.params)
    except TypeError as exc:
        raise ComponentError(f"cannot create {kind} {ref.id!r} ({where}) with its params: {exc}") from None


def build_request(
    index: int, req: RunRequest, registry: Registry, extra_recipes: Iterable[Recipe] = ()
) -> RequestSetup:
    """Resolve and instantiate every component of ``req``, then load and select its tasks.

    :raises ComponentError: for an id that does not resolve or a wrong type.
    :raises TaskIdError: for empty, unsafe or duplicate task ids.
    """
    at = f"requests[{index}]"
    benchmark = _instantiate(registry, "benchmark", req.benchmark, f"{at}.benchmark.id", BaseBenchmark)
    harness: BaseHarness | None = None
    if req.harness.id == "none":
        if not isinstance(benchmark, HarnessFreeBenchmark):
            raise ComponentError(
                f"{at}.harness.id is 'none' but benchmark {req.benchmark.id!r} is not a HarnessFreeBenchmark; "
                "name a harness or implement run_task in a HarnessFreeBenchmark"
            )
    else:
        harness = _instantiate(registry, "harness", req.harness, f"{at}.harness.id", BaseHarness)
    env_ref = ComponentRef(id=req.environment.id, params=req.environment.params)
    provider = _instantiate(registry, "environment", env_ref, f"{at}.environment.id", BaseEnvironment, req.environment)
    strategy = registry.resolve("strategy", req.execution.attempts.strategy, f"{at}.execution.attempts.strategy")
    if isinstance(strategy, type):
        strategy = strategy()
    if not isinstance(strategy, AttemptStrategy):
        raise ComponentError(f"strategy {req.execution.attempts.strategy!r} does not implement needs_more/combine")
    analyzers: list[BaseAnalyzer] = [
        _instantiate(registry, "analyzer", ref, f"{at}.analyzers[{i}].id", BaseAnalyzer)
        for i, ref in enumerate(req.analyzers)
    ]
    recipes: list[Recipe] = []
    for i, ref in enumerate(req.recipes):
        recipe = registry.resolve("recipe", ref.id, f"{at}.recipes[{i}].id")
        recipes.append(recipe(**ref.params) if isinstance(recipe, type) else recipe)
    recipes.extend(extra_recipes)
    for recipe in recipes:
        if not isinstance(recipe, Recipe):
            raise ComponentError(f"recipe {recipe!r} ({at}.recipes) lacks name/overrides/matches/adjust")

    loaded = list(_run_sync(benchmark.load_tasks(req)) or [])
    validate_task_ids(loaded, req.name)
    selected = list(_run_sync(benchmark.select_tasks(loaded, req)) or [])
    known = {t.task_id for t in loaded}
    strays = [t.task_id for t in selected if t.task_id not in known]
    if strays:
        raise TaskIdError(f"request {req.name!r}: select_tasks returned tasks load_tasks did not: {strays[:5]}")
    validate_task_ids(selected, req.name)
    return RequestSetup(index, req, benchmark, harness, provider, strategy, analyzers, recipes, selected)


def validate_task_ids(tasks: Sequence[Any], request: str) -> None:
    seen: set[str] = set()
    for position, task in enumerate(tasks):
        if not isinstance(task, TaskSpec):
            raise TaskIdError(f"request {request!r}: task #{position} is a {type(task).__name__}, not a TaskSpec")
        if not task.task_id:
            raise TaskIdError(f"request {request!r}: task #{position} has an empty task_id")
        if not SAFE_NAME.match(task.task_id):
            raise TaskIdError(
                f"request {request!r}: task id {task.task_id!r} is not safe as a file name and node id "
                "(use letters, digits, '.', '_' and '-'; start with a letter or digit; at most 200 characters)"
            )
        if task.task_id in seen:
            raise TaskIdError(f"request {request!r}: duplicate task id {task.task_id!r}")
        seen.add(task.task_id)
