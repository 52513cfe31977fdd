"""pytest-agentcompass: agent and LLM benchmarks as pytest test sessions.

Everything a benchmark, harness or provider author needs is importable from
here; the submodules are implementation details.
"""

from .analysis import BaseAnalyzer
from .benchmark import BaseBenchmark, HarnessFreeBenchmark
from .config import (
    AttemptsSpec,
    ComponentRef,
    EnvironmentSpec,
    ExecutionSpec,
    ModelSpec,
    NetworkSpec,
    Orchestration,
    RunRequest,
    TimeoutsSpec,
    load_config,
)
from .environments.base import BaseEnvironment, EnvironmentSession, SessionConfig
from .environments.local import LocalEnvironment, LocalSession
from .errors import (
    AgentCompassError,
    ArtifactError,
    ComponentError,
    ConfigError,
    PolicyError,
    PreflightError,
    TaskIdError,
    WorkspacePathError,
)
from .evidence import apply_verifier_result, read_artifact, verifier_evidence
from .harnesses.base import BaseHarness
from .harnesses.command import CommandHarness
from .registry import Registry
from .runtime.planner import Recipe
from .runtime.strategies import AttemptScheduler, AttemptStrategy
from .runtime.task import TaskOutcome
from .types import (
    EvaluationMode,
    ExecResult,
    ExecutionPlan,
    NetworkPolicy,
    PreparedTask,
    RunResult,
    RunStatus,
    TaskSpec,
)

__all__ = [
    "AgentCompassError",
    "ArtifactError",
    "AttemptScheduler",
    "AttemptStrategy",
    "AttemptsSpec",
    "BaseAnalyzer",
    "BaseBenchmark",
    "BaseEnvironment",
    "BaseHarness",
    "CommandHarness",
    "ComponentError",
    "ComponentRef",
    "ConfigError",
    "EnvironmentSession",
    "EnvironmentSpec",
    "EvaluationMode",
    "ExecResult",
    "ExecutionPlan",
    "ExecutionSpec",
    "HarnessFreeBenchmark",
    "LocalEnvironment",
    "LocalSession",
    "ModelSpec",
    "NetworkPolicy",
    "NetworkSpec",
    "Orchestration",
    "PolicyError",
    "PreflightError",
    "PreparedTask",
    "Recipe",
    "Registry",
    "RunRequest",
    "RunResult",
    "RunStatus",
    "SessionConfig",
    "TaskIdError",
    "TaskOutcome",
    "TaskSpec",
    "TimeoutsSpec",
    "WorkspacePathError",
    "apply_verifier_result",
    "load_config",
    "read_artifact",
    "verifier_evidence",
]

__version__ = "0.1.0"
