"""Assembling a request: its components and tasks (once, at collection), then its runtime.

Takes plain arguments (the loaded config, a registry, a fixture resolver) so
that the pytest face and a plain ``asyncio.run`` build requests the same way.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from ..analyzers.base import BaseAnalyzer
from ..benchmarks.base import BaseBenchmark, HarnessFreeBenchmark
from ..benchmarks.metrics import check_gate_names
from ..config import SAFE_NAME, ComponentRef, LoadedConfig, RunRequest, format_loc
from ..environments.base import BaseEnvironment
from ..harnesses.base import BaseHarness
from ..vocabulary.errors import ComponentError, TaskIdError
from ..vocabulary.redact import Redactor
from ..vocabulary.types import TaskSpec
from .planner import Planner, Recipe
from .registry import ComponentKind, Registry
from .signatures import check_lifecycle_methods
from .strategies import AttemptStrategy

if TYPE_CHECKING:
    from ..gateway import ModelGateway

__all__ = [
    "FIXTURE_PREFIX",
    "FixtureResolver",
    "RequestSetup",
    "RunOptions",
    "build_request",
    "validate_task_ids",
]

#: ``id: "fixture:<name>"``: the component comes from a session-scoped pytest fixture.
FIXTURE_PREFIX = "fixture:"
#: ``(fixture name, where in the config) -> value`` (supplied by the pytest face).
FixtureResolver = Callable[[str, str], Any]


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
    #: How many tasks ``load_tasks`` returned, before ``select_tasks``.
    loaded: int = 0
    #: The model gateway, when the harness needs one and the request names a model.
    gateway: ModelGateway | None = None

    def planner(self) -> Planner:
        return Planner(self.req, self.benchmark, self.provider, self.recipes, self.harness)


def _run_sync(value: Any) -> Any:
    # Collection happens outside any event loop: async load/select run here.
    if inspect.isawaitable(value):

        async def wait() -> Any:
            return await value

        return asyncio.run(wait())
    return value


def validate_params(
    cls: Any,
    params: dict[str, Any],
    loaded: LoadedConfig | None,
    loc: tuple[Any, ...],
    rootdir: Path | None = None,
) -> Any:
    """``params`` checked against ``cls.params_model`` when it declares one; ``None`` when it does not.

    :raises ConfigError: ``file:line: yaml.path: message`` for each problem.
    """
    model = getattr(cls, "params_model", None)
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return None
    context = {"config_dir": loaded.directory if loaded else None, "rootdir": rootdir}
    try:
        return model.model_validate(params, context=context)
    except ValidationError as exc:
        if loaded is None:
            raise ComponentError(f"{cls.__name__} params: {exc}") from None
        raise loaded.validation_error(loc, exc) from None


def _fields(model: BaseModel) -> dict[str, Any]:
    return {name: getattr(model, name) for name in type(model).model_fields}


def _instantiate(
    registry: Registry,
    kind: ComponentKind,
    ref: ComponentRef,
    loc: tuple[Any, ...],
    base: type,
    *,
    loaded: LoadedConfig | None = None,
    fixtures: FixtureResolver | None = None,
    spec: Any = None,
) -> Any:
    """Resolve ``ref`` and build it with its (validated) params.

    Environment providers are built as ``cls(spec)`` and find their params in
    ``spec.params``; every other kind as ``cls(**params)``.
    """
    where = _where(loc, "id")
    cls: Any
    if ref.id.startswith(FIXTURE_PREFIX):
        if fixtures is None:
            raise ComponentError(f"{kind} {ref.id!r} ({where}): fixtures can only supply components under pytest")
        value = fixtures(ref.id[len(FIXTURE_PREFIX) :], where)
        if isinstance(value, base):
            if ref.params:
                raise ComponentError(f"{kind} {ref.id!r} ({where}): the fixture gave an instance, it takes no params")
            check_lifecycle_methods(value, _LIFECYCLE, kind, ref.id, where)
            return value
        cls = value
    else:
        cls = registry.resolve(kind, ref.id, where)
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise ComponentError(f"{kind} {ref.id!r} ({where}) is not a subclass of {base.__name__}")
    factory: Any = cls  # a subclass of ``base``: its own signature applies
    model = validate_params(cls, dict(ref.params), loaded, (*loc, "params"), registry.rootdir)
    try:
        if spec is not None:
            if model is not None:
                spec = spec.model_copy(update={"params": _fields(model)})
            provider = factory(spec, loaded.directory if loaded else None)
            provider.params = model
            return provider
        component = factory(**(_fields(model) if model is not None else ref.params))
    except TypeError as exc:
        message = f"cannot create {kind} {ref.id!r} with these params: {exc}"
        if loaded is not None:
            raise loaded.error_at((*loc, "params"), message) from None
        raise ComponentError(f"{message} ({where})") from None
    check_lifecycle_methods(component, _LIFECYCLE, kind, ref.id, where)
    return component


#: The classes whose methods the runtime calls on a component (environments are called by their spec instead).
_LIFECYCLE = (BaseBenchmark, HarnessFreeBenchmark, BaseHarness, BaseAnalyzer)


def _where(loc: tuple[Any, ...], leaf: str) -> str:
    return format_loc((*loc, leaf))


def build_request(
    index: int,
    req: RunRequest,
    registry: Registry,
    extra_recipes: Iterable[Recipe] = (),
    *,
    loaded: LoadedConfig | None = None,
    fixtures: FixtureResolver | None = None,
) -> RequestSetup:
    """Resolve and instantiate every component of ``req``, then load and select its tasks.

    :raises ConfigError: for params a component's ``params_model`` refuses, and for gates on metrics the
        benchmark does not return or minimums outside their range (``benchmarks.metrics``).
    :raises ComponentError: for an id that does not resolve or a wrong type.
    :raises TaskIdError: for empty, unsafe or duplicate task ids.
    """
    at = f"requests[{index}]"
    loc: tuple[Any, ...] = ("requests", index)
    opts: dict[str, Any] = {"loaded": loaded, "fixtures": fixtures}
    benchmark = _instantiate(registry, "benchmark", req.benchmark, (*loc, "benchmark"), BaseBenchmark, **opts)
    harness: BaseHarness | None = None
    if req.harness.id == "none":
        if not isinstance(benchmark, HarnessFreeBenchmark):
            raise ComponentError(
                f"{at}.harness.id is 'none' but benchmark {req.benchmark.id!r} is not a HarnessFreeBenchmark; "
                "name a harness or implement run_task in a HarnessFreeBenchmark"
            )
    else:
        harness = _instantiate(registry, "harness", req.harness, (*loc, "harness"), BaseHarness, **opts)
    env_ref = ComponentRef(id=req.environment.id, params=req.environment.params)
    provider = _instantiate(
        registry, "environment", env_ref, (*loc, "environment"), BaseEnvironment, spec=req.environment, **opts
    )
    strategy = registry.resolve("strategy", req.execution.attempts.strategy, f"{at}.execution.attempts.strategy")
    if isinstance(strategy, type):
        strategy = strategy()
    if not isinstance(strategy, AttemptStrategy):
        raise ComponentError(f"strategy {req.execution.attempts.strategy!r} does not implement needs_more/combine")
    analyzers: list[BaseAnalyzer] = [
        _instantiate(registry, "analyzer", ref, (*loc, "analyzers", i), BaseAnalyzer, **opts)
        for i, ref in enumerate(req.analyzers)
    ]
    recipes: list[Recipe] = []
    for i, ref in enumerate(req.recipes):
        recipe = registry.resolve("recipe", ref.id, f"{at}.recipes[{i}].id")
        if isinstance(recipe, type):
            model = validate_params(recipe, dict(ref.params), loaded, (*loc, "recipes", i, "params"), registry.rootdir)
            recipe = recipe(**(_fields(model) if model is not None else ref.params))
        recipes.append(recipe)
    recipes.extend(extra_recipes)
    for recipe in recipes:
        if not isinstance(recipe, Recipe):
            raise ComponentError(f"recipe {recipe!r} ({at}.recipes) lacks name/overrides/matches/adjust")

    all_tasks = _task_list(_run_sync(benchmark.load_tasks(req)), req.name, "load_tasks")
    validate_task_ids(all_tasks, req.name)
    selected = _task_list(_run_sync(benchmark.select_tasks(all_tasks, req)), req.name, "select_tasks")
    known = {t.task_id for t in all_tasks}
    strays = [t.task_id for t in selected if t.task_id not in known]
    if strays:
        raise TaskIdError(f"request {req.name!r}: select_tasks returned tasks load_tasks did not: {strays[:5]}")
    validate_task_ids(selected, req.name)
    setup = RequestSetup(index, req, benchmark, harness, provider, strategy, analyzers, recipes, selected)
    setup.loaded = len(all_tasks)
    setup.gateway = _gateway(req, harness, provider, loaded, loc)
    check_gate_names(loaded, index, req, benchmark)
    return setup


def _gateway(
    req: RunRequest,
    harness: BaseHarness | None,
    provider: BaseEnvironment,
    loaded: LoadedConfig | None,
    loc: tuple[Any, ...],
) -> ModelGateway | None:
    """The request's model gateway, its ``model.params`` checked now (file and line), started on first use.

    A harness that calls the model itself has its ``model.params`` checked here too, against the
    schema it declares (``model_settings``).
    """
    if harness is None or req.model is None:
        return None
    if not harness.needs_gateway:
        if harness.model_settings is not None:
            _checked(harness.model_settings, req, loaded, loc)
        return None
    from ..gateway import GatewaySettings, ModelGateway

    settings = _checked(GatewaySettings, req, loaded, loc)
    protocols = frozenset(harness.gateway_protocols)
    secrets = tuple(loaded.secrets) if loaded is not None else ()  # masked in what the agent is sent back
    return ModelGateway(req.model.id, settings, provider, harness=req.harness.id, protocols=protocols, secrets=secrets)


def _checked(schema: Any, req: RunRequest, loaded: LoadedConfig | None, loc: tuple[Any, ...]) -> Any:
    """``req.model.params`` validated by ``schema``; a problem names the config's file and line."""
    assert req.model is not None
    try:
        return schema.model_validate(req.model.params)
    except ValidationError as exc:
        if loaded is None:
            raise ComponentError(f"request {req.name!r}: model.params: {exc}") from None
        raise loaded.validation_error((*loc, "model", "params"), exc) from None


def _task_list(value: Any, request: str, method: str) -> list[Any]:
    if value is None:
        raise TaskIdError(f"request {request!r}: {method} returned None; it must return a list of TaskSpec")
    if isinstance(value, str | bytes | TaskSpec) or not isinstance(value, Iterable):
        raise TaskIdError(
            f"request {request!r}: {method} returned a {type(value).__name__}; it must return a list of TaskSpec"
        )
    return list(value)


def validate_task_ids(tasks: Sequence[Any], request: str) -> None:
    seen: set[str] = set()
    for position, task in enumerate(tasks):
        if not isinstance(task, TaskSpec):
            raise TaskIdError(f"request {request!r}: task #{position} is a {type(task).__name__}, not a TaskSpec")
        if not isinstance(task.task_id, str):
            raise TaskIdError(
                f"request {request!r}: task #{position} has task_id {task.task_id!r} "
                f"(an {type(task.task_id).__name__}); task ids are strings, e.g. TaskSpec(task_id=str(n))"
            )
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


@dataclass(frozen=True)
class RunOptions:
    """Run-wide choices that shape every request's runtime (from the command line)."""

    run_id: str
    redactor: Redactor = field(default_factory=Redactor)
    config_dump: dict[str, Any] = field(default_factory=dict)
    carry_over: str | None = None  # latest | <run dir>, for every request
    new_run: bool = False  # do not resume an unfinished run
    rerun_selected: bool = False  # --lf: selected tasks run even when a reusable detail exists
