"""pytest-agentcompass: agent and LLM benchmarks as pytest test sessions.

Everything a benchmark, harness or provider author needs is importable from
here; the submodules are implementation details. Names load on first use so
that an installed plugin costs an unrelated pytest run nothing.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .analyzers.base import BaseAnalyzer
    from .benchmarks.base import BaseBenchmark, HarnessFreeBenchmark
    from .benchmarks.evidence import apply_verifier_result, read_artifact, verifier_evidence
    from .config import (
        AttemptsSpec,
        ComponentRef,
        ConfigPath,
        EnvironmentSpec,
        ExecutionSpec,
        ModelSpec,
        NetworkSpec,
        Orchestration,
        ParamsModel,
        RunRequest,
        TimeoutsSpec,
        load_config,
    )
    from .environments.base import BaseEnvironment, EnvironmentSession, HostRoute, SessionConfig
    from .environments.local import LocalEnvironment, LocalSession
    from .gateway import GatewaySettings, Grant, ModelGateway
    from .harnesses.agents import AgentHarness, AgentParams, AgentReport, AgentRun, ModelEndpoint, untar
    from .harnesses.agents.cache import NpmPackage, PipWheels, tarball_name
    from .harnesses.base import BaseHarness
    from .harnesses.command import CommandHarness
    from .harnesses.openai_chat import OpenAIChatHarness
    from .harnesses.shell_agent import ShellAgentHarness
    from .models import ModelSettings, Trajectory
    from .models.ledger import CallLedger, ModelCall
    from .runtime.planner import Recipe
    from .runtime.registry import Registry
    from .runtime.strategies import AttemptScheduler, AttemptStrategy
    from .runtime.task import TaskOutcome
    from .vocabulary.artifacts import artifact_name, save_artifact, save_artifact_stream
    from .vocabulary.errors import (
        AgentCompassError,
        ArtifactError,
        ComponentError,
        ConfigError,
        PolicyError,
        PreflightError,
        TaskIdError,
        WorkspacePathError,
    )
    from .vocabulary.types import (
        EvaluationMode,
        ExecResult,
        ExecutionPlan,
        NetworkPolicy,
        PreparedTask,
        RunResult,
        RunStatus,
        TaskSpec,
    )

_EXPORTS = {
    "AgentCompassError": ".vocabulary.errors",
    "AgentHarness": ".harnesses.agents",
    "AgentParams": ".harnesses.agents",
    "AgentReport": ".harnesses.agents",
    "AgentRun": ".harnesses.agents",
    "ModelEndpoint": ".harnesses.agents",
    "NpmPackage": ".harnesses.agents.cache",
    "PipWheels": ".harnesses.agents.cache",
    "tarball_name": ".harnesses.agents.cache",
    "untar": ".harnesses.agents",
    "ArtifactError": ".vocabulary.errors",
    "AttemptScheduler": ".runtime.strategies",
    "AttemptStrategy": ".runtime.strategies",
    "AttemptsSpec": ".config",
    "BaseAnalyzer": ".analyzers.base",
    "BaseBenchmark": ".benchmarks.base",
    "BaseEnvironment": ".environments.base",
    "BaseHarness": ".harnesses.base",
    "CallLedger": ".models.ledger",
    "CommandHarness": ".harnesses.command",
    "GatewaySettings": ".gateway",
    "Grant": ".gateway",
    "HostRoute": ".environments.base",
    "ModelCall": ".models.ledger",
    "ModelGateway": ".gateway",
    "ModelSettings": ".models",
    "OpenAIChatHarness": ".harnesses.openai_chat",
    "ShellAgentHarness": ".harnesses.shell_agent",
    "Trajectory": ".models",
    "save_artifact": ".vocabulary.artifacts",
    "save_artifact_stream": ".vocabulary.artifacts",
    "artifact_name": ".vocabulary.artifacts",
    "ComponentError": ".vocabulary.errors",
    "ComponentRef": ".config",
    "ConfigPath": ".config",
    "ConfigError": ".vocabulary.errors",
    "EnvironmentSession": ".environments.base",
    "EnvironmentSpec": ".config",
    "EvaluationMode": ".vocabulary.types",
    "ExecResult": ".vocabulary.types",
    "ExecutionPlan": ".vocabulary.types",
    "ExecutionSpec": ".config",
    "HarnessFreeBenchmark": ".benchmarks.base",
    "LocalEnvironment": ".environments.local",
    "LocalSession": ".environments.local",
    "ModelSpec": ".config",
    "NetworkPolicy": ".vocabulary.types",
    "NetworkSpec": ".config",
    "Orchestration": ".config",
    "ParamsModel": ".config",
    "PolicyError": ".vocabulary.errors",
    "PreflightError": ".vocabulary.errors",
    "PreparedTask": ".vocabulary.types",
    "Recipe": ".runtime.planner",
    "Registry": ".runtime.registry",
    "RunRequest": ".config",
    "RunResult": ".vocabulary.types",
    "RunStatus": ".vocabulary.types",
    "SessionConfig": ".environments.base",
    "TaskIdError": ".vocabulary.errors",
    "TaskOutcome": ".runtime.task",
    "TaskSpec": ".vocabulary.types",
    "TimeoutsSpec": ".config",
    "WorkspacePathError": ".vocabulary.errors",
    "apply_verifier_result": ".benchmarks.evidence",
    "load_config": ".config",
    "read_artifact": ".benchmarks.evidence",
    "verifier_evidence": ".benchmarks.evidence",
}

__all__ = [
    "AgentCompassError",
    "AgentHarness",
    "AgentParams",
    "AgentReport",
    "AgentRun",
    "ArtifactError",
    "AttemptScheduler",
    "AttemptStrategy",
    "AttemptsSpec",
    "BaseAnalyzer",
    "BaseBenchmark",
    "BaseEnvironment",
    "BaseHarness",
    "CallLedger",
    "CommandHarness",
    "ComponentError",
    "ComponentRef",
    "ConfigError",
    "ConfigPath",
    "EnvironmentSession",
    "EnvironmentSpec",
    "EvaluationMode",
    "ExecResult",
    "ExecutionPlan",
    "ExecutionSpec",
    "GatewaySettings",
    "Grant",
    "HarnessFreeBenchmark",
    "HostRoute",
    "LocalEnvironment",
    "LocalSession",
    "ModelCall",
    "ModelEndpoint",
    "ModelGateway",
    "ModelSettings",
    "ModelSpec",
    "NetworkPolicy",
    "NetworkSpec",
    "NpmPackage",
    "OpenAIChatHarness",
    "Orchestration",
    "ParamsModel",
    "PipWheels",
    "PolicyError",
    "PreflightError",
    "PreparedTask",
    "Recipe",
    "Registry",
    "RunRequest",
    "RunResult",
    "RunStatus",
    "SessionConfig",
    "ShellAgentHarness",
    "TaskIdError",
    "TaskOutcome",
    "TaskSpec",
    "TimeoutsSpec",
    "Trajectory",
    "WorkspacePathError",
    "apply_verifier_result",
    "artifact_name",
    "load_config",
    "read_artifact",
    "save_artifact",
    "save_artifact_stream",
    "tarball_name",
    "untar",
    "verifier_evidence",
]

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    return _load_export(__name__, _EXPORTS, name)


def _load_export(package: str, exports: Mapping[str, str], name: str) -> Any:
    """``name`` of ``package``, from the submodule ``exports`` names (a package's lazy ``__getattr__``)."""
    module = exports.get(name)
    if module is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    # Not cached in globals(): the submodule in sys.modules stays the one
    # source of truth (pytester's in-process runs drop and re-import it).
    return getattr(importlib.import_module(module, package), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
