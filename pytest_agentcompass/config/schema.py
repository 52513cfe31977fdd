"""The config file's schema: pydantic models, unknown keys refused everywhere.

Loading a file (YAML, ``${VAR}``, errors with file and line) is :mod:`.loading`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from ..vocabulary.types import EvaluationMode, NetworkPolicy

__all__ = [
    "MAX_STORED_CHARS",
    "SAFE_NAME",
    "AttemptsSpec",
    "ComponentRef",
    "ConfigPath",
    "EnvironmentSpec",
    "ExecutionSpec",
    "ModelSpec",
    "NetworkSpec",
    "Orchestration",
    "ParamsModel",
    "RunRequest",
    "TimeoutsSpec",
]

#: Characters a run directory keeps of one text field of a task's records (``execution.max_stored_chars``).
MAX_STORED_CHARS = 1_000_000

#: Names used in file names and pytest node ids.
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class ParamsModel(BaseModel):
    """Base for a component's ``params_model``: unknown keys are errors, as everywhere in the config."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True, defer_build=True)


def _relative_to_config(value: Path, info: ValidationInfo) -> Path:
    context = info.context or {}
    base, rootdir = context.get("config_dir"), context.get("rootdir")
    if value.is_absolute() or base is None:
        return value
    resolved = Path(base) / value
    if not resolved.exists() and rootdir is not None and (Path(rootdir) / value).exists():
        return Path(rootdir) / value  # configs written before paths followed the config file
    return resolved


#: A path param: relative values are resolved against the config file's folder
#: (when nothing is there but the path exists under the pytest rootdir, that is used).
ConfigPath = Annotated[Path, AfterValidator(_relative_to_config)]


class ComponentRef(_Model):
    """A component by id (registry name, ``module:Class`` or ``file.py:Class``)."""

    id: str = Field(min_length=1)
    params: dict[str, Any] = Field(default_factory=dict)


class ModelSpec(_Model):
    """A model: the one under test, or a controller-side judge."""

    id: str = Field(min_length=1)
    version: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)


class NetworkSpec(_Model):
    """Network policy per phase; ``run``/``evaluation`` default to ``baseline``."""

    baseline: NetworkPolicy = "full"
    run: NetworkPolicy | None = None
    evaluation: NetworkPolicy | None = None


class EnvironmentSpec(_Model):
    """Which provider opens task Environments, and its process-wide limits."""

    id: str = "local"
    params: dict[str, Any] = Field(default_factory=dict)
    evaluation_environment_mode: EvaluationMode | None = None
    capacity: int = Field(default=0, ge=0)
    open_qps: float = Field(default=0, ge=0)
    network: NetworkSpec = Field(default_factory=NetworkSpec)


class AttemptsSpec(_Model):
    """Semantic attempts: ``k`` independent tries combined by ``strategy``."""

    k: int = Field(default=1, ge=1)
    strategy: str = "avg"


class TimeoutsSpec(_Model):
    """Per-stage time limits in seconds; ``None`` means no limit."""

    prepare: float | None = Field(default=None, gt=0)
    run: float | None = Field(default=None, gt=0)
    artifacts: float | None = Field(default=None, gt=0)
    evaluate: float | None = Field(default=None, gt=0)


class ExecutionSpec(_Model):
    """How each task is attempted, retried and judged."""

    attempts: AttemptsSpec = Field(default_factory=AttemptsSpec)
    max_retries: int = Field(default=0, ge=0)
    #: ``None`` (the spec's rule): any error retries; a list: errors matching one of the
    #: regular expressions; ``[]``: none; ``"transient"``: infrastructure faults only, by kind.
    retry_pattern_list: list[str] | Literal["transient"] | None = None
    retry_backoff_seconds: float = Field(default=0.2, ge=0, allow_inf_nan=False)  # .inf would wait for the deadline
    keep_environment: bool = False
    #: A task passes with a score at or above it; finite (``.nan`` would pass nothing, ``.inf`` too).
    pass_threshold: float = Field(default=1.0, allow_inf_nan=False)
    timeouts: TimeoutsSpec = Field(default_factory=TimeoutsSpec)
    #: What an integrity finding (``RunResult.metadata["integrity"]``) does: ``flag`` reports the
    #: task as flagged and keeps its score; ``strict`` makes it an ``evaluation_error``.
    integrity: Literal["flag", "strict"] = "flag"
    #: Characters kept of each text field (an output, a message) in the run directory's
    #: per-task records: a longer one keeps its head and tail, and the record says so.
    max_stored_chars: int = Field(default=MAX_STORED_CHARS, ge=100)
    #: How the run directory keeps the per-task records: ``files`` (``details/<task>.json``, the
    #: spec's layout) or ``journal`` (``details/journal.jsonl``, one line per task: one file for
    #: the whole run, for runs of many quick tasks). A run keeps the layout it began with.
    details_layout: Literal["files", "journal"] = "files"

    @field_validator("retry_pattern_list", mode="before")
    @classmethod
    def _patterns_compile(cls, value: Any) -> Any:
        policies = (
            "use null (any error retries), a list of regular expressions (errors that match one), "
            "[] (none) or transient (infrastructure faults only)"
        )
        if (isinstance(value, str) and value != "transient") or not isinstance(value, str | list | None):
            # A mapping or a boolean gave two lines about the union's members, neither saying what is allowed.
            raise ValueError(f"{value!r} is not a retry policy: {policies}")
        if value == ["transient"]:  # would retry errors whose text says "transient", nothing else
            raise ValueError(
                "['transient'] is a list of one pattern (errors whose text matches 'transient'); "
                "the policy is written without brackets: retry_pattern_list: transient"
            )
        if isinstance(value, list):
            for pattern in value:
                if not isinstance(pattern, str):
                    raise ValueError(f"pattern {pattern!r} is not a string (quote it)")
                try:
                    re.compile(pattern)
                except re.error as exc:
                    raise ValueError(f"invalid regular expression {pattern!r}: {exc}") from None
        return value


class RunRequest(_Model):
    """One named evaluation: a benchmark run through a harness in an environment."""

    name: str
    benchmark: ComponentRef
    harness: ComponentRef = Field(default_factory=lambda: ComponentRef(id="none"))
    environment: EnvironmentSpec = Field(default_factory=EnvironmentSpec)
    execution: ExecutionSpec = Field(default_factory=ExecutionSpec)
    model: ModelSpec | None = None
    judge: ModelSpec | None = None
    analyzers: list[ComponentRef] = Field(default_factory=list)
    recipes: list[ComponentRef] = Field(default_factory=list)
    #: ``latest`` or a run directory: finished results of that earlier run are carried over into
    #: this one (copied, not run again). ``reuse`` was its name before 0.2 (:mod:`.loading` renames it).
    carry_over: str | None = None
    #: Minimum values of aggregate metrics (``{"pass@1": 0.7}``). With gates the
    #: request is judged by them: one extra pytest item checks them after
    #: finalization, and tasks below the pass threshold are expected failures.
    #: A minimum is a YAML number: ``true`` (1.0) and ``"0.9"`` were coerced in silence.
    gates: dict[str, Annotated[float, Field(allow_inf_nan=False, strict=True)]] = Field(default_factory=dict)
    #: How gates count a task that ended in an error: ``fail`` (a failed task scoring 0),
    #: or ``exclude`` (judge only the tasks that were scored; errors an agent can cause
    #: then make a gate easier to pass).
    gate_errors: Literal["fail", "exclude"] = "fail"

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        if not SAFE_NAME.match(value):
            raise ValueError(
                f"request name {value!r} must start with a letter or digit and use only "
                "letters, digits, '.', '_' and '-'"
            )
        return value


class Orchestration(_Model):
    """The whole config file: run-wide settings and requests in priority order."""

    output_dir: str = ".agentcompass/runs"
    task_concurrency: int = Field(default=8, ge=1)
    timeout_seconds: float | None = Field(default=None, gt=0)
    cleanup_grace_seconds: float = Field(default=30, ge=0)
    requests: list[RunRequest] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_names(self) -> Orchestration:
        seen: set[str] = set()
        for request in self.requests:
            if request.name in seen:
                raise ValueError(f"duplicate request name {request.name!r}")
            seen.add(request.name)
        return self
