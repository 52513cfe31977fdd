"""The vocabulary every layer shares: tasks, results, plans and statuses.

Plain dataclasses on purpose: benchmarks build and ``dataclasses.replace`` them
freely, and the runtime serialises them with :func:`to_jsonable`.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "EvaluationMode",
    "ExecResult",
    "ExecutionPlan",
    "NetworkPolicy",
    "OrchestrationEvent",
    "OrchestrationStatus",
    "PreparedTask",
    "RequestState",
    "RunResult",
    "RunStatus",
    "TaskSpec",
    "TaskState",
    "USER_MODULE_PREFIX",
    "to_jsonable",
]

#: The prefix of the module name a benchmark's own file (``bench.py:MyBench``) is imported under.
USER_MODULE_PREFIX = "agentcompass_user_"

#: Where ``Benchmark.evaluate`` runs: in process (``none``), in the task
#: Environment (``reuse``) or in a new evaluation Environment (``fresh``).
EvaluationMode = Literal["none", "reuse", "fresh"]
EVALUATION_MODES: tuple[EvaluationMode, ...] = ("none", "reuse", "fresh")

#: Network access of an Environment during one phase. ``full`` is
#: unrestricted, ``disabled`` has no network at all.
NetworkPolicy = Literal["full", "disabled"]


class RunStatus(enum.StrEnum):
    """Where a result stands.

    ``completed`` is the raw state an inference path returns; the runtime turns
    it into ``scored`` once ``evaluate`` attached a score. ``task_error`` is a
    task that cannot run at all, by its own fault (see :attr:`TaskSpec.broken`):
    never retried, never counted as infrastructure.
    """

    COMPLETED = "completed"
    SCORED = "scored"
    INFERENCE_ERROR = "inference_error"
    ENVIRONMENT_ERROR = "environment_error"
    EVALUATION_ERROR = "evaluation_error"
    TASK_ERROR = "task_error"
    CANCELLED = "cancelled"

    @property
    def is_error(self) -> bool:
        return self in _ERROR_STATUSES


_ERROR_STATUSES = frozenset(
    {
        RunStatus.INFERENCE_ERROR,
        RunStatus.ENVIRONMENT_ERROR,
        RunStatus.EVALUATION_ERROR,
        RunStatus.TASK_ERROR,
        RunStatus.CANCELLED,
    }
)


class TaskState(enum.StrEnum):
    """A terminal task in one word: what counts, baselines and reports compare."""

    PASSED = "passed"
    FAILED = "failed"  # a valid score below the pass threshold
    ERROR = "error"  # no valid score (an error status, cancelled included)

    @classmethod
    def of(cls, status: RunStatus | str, passed: bool) -> TaskState:
        """The state of a task whose result has ``status`` (a status this version does not know is no error)."""
        try:
            is_error = RunStatus(status).is_error
        except ValueError:
            is_error = False
        return cls.ERROR if is_error else (cls.PASSED if passed else cls.FAILED)


class RequestState(enum.StrEnum):
    """Where a request's run stands: ``status`` in its ``run_info.json`` (and ``summary.json``)."""

    CREATED = "created"  # claimed, nothing prepared yet
    RUNNING = "running"  # prepared; tasks run (or the process running them was killed)
    COMPLETED = "completed"  # every wanted task has a result; never resumed
    STOPPED = "stopped"  # ``-x``/``--maxfail``: what had started finished, the rest never ran
    TIMEOUT = "timeout"  # the orchestration's deadline passed
    INTERRUPTED = "interrupted"  # Ctrl-C, SIGTERM, a lost worker, or killed and swept since
    FAILED = "failed"  # the request could not run (preflight or preparation)

    @property
    def unfinished(self) -> bool:
        """Begun and never ended: its process is running it, or was killed."""
        return self in (RequestState.CREATED, RequestState.RUNNING)


class OrchestrationStatus(enum.StrEnum):
    """How an orchestration (every request of one pytest session) ended."""

    COMPLETED = "completed"
    STOPPED = "stopped"
    TIMEOUT = "timeout"
    INTERRUPTED = "interrupted"


class OrchestrationEvent(enum.StrEnum):
    """What the Orchestrator tells its observer about a request, in this order."""

    OPEN = "open"  # about to open its run (its run directory, its queue)
    OPENED = "opened"  # its run is open, and it did not fail
    FINALIZE = "finalize"  # about to finalize it (every task it ran here is done)
    FINALIZED = "finalized"  # finalized: its summary is written (when this process owns the run)


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """One sample of a benchmark, as ``Benchmark.load_tasks`` returns it.

    :param task_id: Unique within the request; used as a file name and in the
        pytest node id, so it is restricted to ``[A-Za-z0-9._-]``.
    :param tags: Extra selection labels; each becomes a keyword and a marker.
    :param aliases: Other names ``-k`` selects the task by (a keyword, never a marker):
        the real name of a folder whose name could not be its id.
    :param evaluation_environment_mode: Per-task override of the benchmark's
        default evaluation mode; the request's own setting still wins.
    :param broken: Why the task itself cannot run (its files are malformed, it
        asks for what no runner here offers), as the benchmark found when it
        loaded it. The runtime reports it as a ``task_error`` without opening
        an Environment or retrying: the fault is the task's, deterministic.
    """

    task_id: str
    question: str = ""
    category: str | None = None
    ground_truth: Any = None
    evaluation_environment_mode: EvaluationMode | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    #: Labels that, like ``category``, become pytest keywords and markers (``-k``/``-m``).
    tags: tuple[str, ...] = ()
    broken: str | None = None
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PreparedTask:
    """What ``Benchmark.prepare_task`` hands to the inference path.

    :param prompt: The input the agent or model receives.
    :param workdir: Working directory inside the task Environment, if any.
    """

    task_id: str
    prompt: str = ""
    workdir: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RunResult:
    """The outcome of one attempt: raw after inference, scored after evaluation.

    :param score: Set by ``Benchmark.evaluate``; ``None`` until then.
    :param artifacts: Data that must survive the task Environment, grouped by
        kind (``{"file": {"submission.patch": "..."}}``). Must be JSON-serialisable.
    """

    task_id: str
    output: Any = None
    score: float | None = None
    status: RunStatus = RunStatus.COMPLETED
    error: str | None = None
    artifacts: Mapping[str, Any] = field(default_factory=dict)
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        status = self.status
        if type(status) is not RunStatus:  # a plain "inference_error" is accepted and normalised
            try:
                object.__setattr__(self, "status", RunStatus(status))
            except ValueError:
                raise ValueError(
                    f"RunResult status {status!r} is not one of {', '.join(s.value for s in RunStatus)}"
                ) from None

    @property
    def is_error(self) -> bool:
        return self.status.is_error

    def to_dict(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "output": to_jsonable(self.output),
            "score": self.score,
            "status": self.status.value,
            "error": self.error,
            "artifacts": to_jsonable(self.artifacts),
            "metadata": to_jsonable(self.metadata),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunResult:
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        values["status"] = RunStatus(values.get("status", RunStatus.COMPLETED))
        return cls(**values)


@dataclass(frozen=True, slots=True)
class ExecResult:
    """What ``EnvironmentSession.exec`` returns.

    ``stdout``/``stderr`` are cut past the provider's output limit; the
    ``*_truncated`` flags say when that happened, and ``*_omitted`` how many
    characters of the stream were dropped (``None``: the provider did not count).
    """

    exit_code: int
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration: float = 0.0
    stdout_omitted: int | None = None
    stderr_omitted: int | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass(frozen=True, slots=True)
class ExecutionPlan:
    """Everything one semantic attempt will do, decided before anything opens.

    Built by the Planner, adjusted by recipes, recorded in ``run_info.json``,
    then reused unchanged by every runtime retry of that attempt.
    """

    task_id: str
    attempt_index: int
    evaluation_environment_mode: EvaluationMode
    baseline_network_policy: NetworkPolicy = "full"
    run_network_policy: NetworkPolicy = "full"
    evaluation_network_policy: NetworkPolicy = "full"
    timeouts: Mapping[str, float | None] = field(default_factory=dict)
    benchmark_plan: Any = None
    components: Mapping[str, str] = field(default_factory=dict)
    recipes: tuple[str, ...] = ()
    #: Per-task provider params the benchmark asks for (an image, a build
    #: context, resource limits); the request's own ``environment.params`` win.
    environment: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "attempt_index": self.attempt_index,
            "evaluation_environment_mode": self.evaluation_environment_mode,
            "baseline_network_policy": self.baseline_network_policy,
            "run_network_policy": self.run_network_policy,
            "evaluation_network_policy": self.evaluation_network_policy,
            "timeouts": dict(self.timeouts),
            "benchmark_plan": to_jsonable(self.benchmark_plan),
            "components": dict(self.components),
            "recipes": list(self.recipes),
            "environment": to_jsonable(self.environment),
        }


_JSON_SCALARS = (str, int, float, bool, type(None))
_RECORDABLE = (*_JSON_SCALARS, bytes, bytearray, enum.Enum)


def unserialisable(result: RunResult) -> str | None:
    """Which part of ``result.artifacts``/``metadata`` cannot be recorded as JSON, or ``None``.

    ``bytes`` are accepted (the store writes them to files); dataclasses, enums,
    pydantic models, mappings and sequences are converted; anything else
    would only be a ``repr``, so it is refused with the field's path.
    """
    for name in ("artifacts", "metadata"):
        value = getattr(result, name)
        if not isinstance(value, Mapping):
            return f"{name} is a {type(value).__name__}, not a dict"
        problem = _unserialisable(value, name, 0)
        if problem is not None:
            return problem
    return None


#: Deeper than this, a value is taken for one that contains itself (it would be a RecursionError).
_MAX_DEPTH = 100


def _unserialisable(value: Any, path: str, depth: int) -> str | None:
    if isinstance(value, _RECORDABLE):
        if isinstance(value, float) and not math.isfinite(value):
            return f"{path} is {value!r}, which JSON cannot hold (use None or a string)"
        return None
    if depth > _MAX_DEPTH:
        field_name, _, _ = path.partition("[")
        return f"{field_name} nests deeper than {_MAX_DEPTH} levels (does it contain itself?) at {path[:60]}..."
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, _JSON_SCALARS):
                return f"{path} has a key of type {type(key).__name__} ({key!r}); keys must be strings"
            problem = _unserialisable(item, f"{path}[{key!r}]", depth + 1)
            if problem is not None:
                return problem
        return None
    if isinstance(value, list | tuple | set | frozenset):
        for index, item in enumerate(value):
            problem = _unserialisable(item, f"{path}[{index}]", depth + 1)
            if problem is not None:
                return problem
        return None
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return _unserialisable(fields, path, depth + 1)
    if hasattr(value, "model_dump"):
        return None
    kind = type(value).__name__
    return f"{path} holds a value of type {kind}, not storable as JSON (use str, numbers, lists, dicts, bytes)"


def to_jsonable(value: Any) -> Any:
    """Turn dataclasses, enums, mappings and sequences into JSON-ready values.

    Anything else unknown becomes its ``repr`` so a record can always be
    written: losing a result to a serialisation error is worse than a repr.
    """
    kind = type(value)
    if value is None or kind is str or kind is int or kind is float or kind is bool:
        return value
    if kind is dict and all(type(k) is str for k in value):
        return {k: to_jsonable(v) for k, v in value.items()}
    if isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, enum.Enum):
        return to_jsonable(value.value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [to_jsonable(v) for v in value]
    if hasattr(value, "model_dump"):
        return to_jsonable(value.model_dump(mode="json"))
    return repr(value)
