"""pytest-agentcompass: agent and LLM benchmarks as pytest test sessions.

Everything a benchmark, harness or provider author needs is importable from
here; the submodules are implementation details. Names load on first use so
that an installed plugin costs an unrelated pytest run nothing.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings
from collections.abc import Mapping, Sequence
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
    from .models.usage import Usage
    from .runtime.registry import Registry
    from .runtime.strategies import AttemptScheduler
    from .vocabulary.artifacts import RunFiles, artifact_name, save_artifact, save_artifact_stream
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
    from .vocabulary.outcome import TaskOutcome
    from .vocabulary.protocols import AttemptStrategy, Recipe
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
    "AttemptStrategy": ".vocabulary.protocols",
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
    "Usage": ".models.usage",
    "RunFiles": ".vocabulary.artifacts",
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
    "Recipe": ".vocabulary.protocols",
    "Registry": ".runtime.registry",
    "RunRequest": ".config",
    "RunResult": ".vocabulary.types",
    "RunStatus": ".vocabulary.types",
    "SessionConfig": ".environments.base",
    "TaskIdError": ".vocabulary.errors",
    "TaskOutcome": ".vocabulary.outcome",
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
    "RunFiles",
    "RunResult",
    "RunStatus",
    "SessionConfig",
    "ShellAgentHarness",
    "TaskIdError",
    "TaskOutcome",
    "TaskSpec",
    "TimeoutsSpec",
    "Usage",
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
    if name in MOVED_MODULES:  # ``pytest_agentcompass.types`` as an attribute: the module, warned about
        return importlib.import_module(f"{__name__}.{name}")
    return _load_export(__name__, _EXPORTS, name)


def _load_export(package: str, exports: Mapping[str, str], name: str) -> Any:
    """``name`` of ``package``, from the submodule ``exports`` names (a package's lazy ``__getattr__``)."""
    module = exports.get(name)
    if module is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    # Not cached in globals(): the submodule in sys.modules stays the one
    # source of truth (pytester's in-process runs drop and re-import it).
    return getattr(importlib.import_module(module, package), name)


# -- module paths of earlier releases -------------------------------------------------------------

#: The release in which the module paths below stop working.
MOVED_UNTIL = "0.3.0"
#: Module paths of earlier releases (relative to the package) -> where the module lives now. An
#: old path, or a module under it, imports the new module itself (one module, not a copy: a
#: monkeypatch through either name changes both) and warns once, naming the new path.
MOVED_MODULES = {
    "agents_cache": "harnesses.agents.cache",
    "agents_cache.recipe": "vocabulary.agent_install",
    "analysis": "analyzers.base",
    "artifacts": "vocabulary.artifacts",
    "benchmark": "benchmarks.base",
    "errors": "vocabulary.errors",
    "evidence": "benchmarks.evidence",
    "hookspecs": "plugin.hookspecs",
    "limits": "concurrency.limits",
    "permit_service": "concurrency.permits",
    "redact": "vocabulary.redact",
    "registry": "runtime.registry",
    "testing": "environments.conformance",
    "types": "vocabulary.types",
}


def moved_to(fullname: str) -> str | None:
    """The module an old ``fullname`` now is (the longest moved prefix wins), or ``None``."""
    relative = fullname[len(__name__) + 1 :] if fullname.startswith(__name__ + ".") else ""
    old = relative
    while old and old not in MOVED_MODULES:
        old = old.rpartition(".")[0]
    if not old:
        return None
    return f"{__name__}.{MOVED_MODULES[old]}{relative[len(old) :]}"


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module path as the module it moved to (first on ``sys.meta_path``, so a
    module under an old package path is not loaded a second time from the new folder)."""

    def __init__(self) -> None:
        self._specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(__name__ + "."):
            return None
        new = moved_to(fullname)
        if new is None or importlib.util.find_spec(new) is None:
            return None  # not moved, or nothing there either: the usual ModuleNotFoundError
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        new = moved_to(spec.name)
        assert new is not None
        warnings.warn(
            f"{spec.name} moved to {new}; the old path stops working in {MOVED_UNTIL}",
            DeprecationWarning,
            stacklevel=_importer_level(),
        )
        module = importlib.import_module(new)
        self._specs[spec.name] = module.__spec__  # the import system sets the alias's on the module
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        module.__spec__ = self._specs.pop(module.__spec__.name if module.__spec__ else "", module.__spec__)


def _importer_level() -> int:
    """The ``stacklevel`` of the line that imported an old path. ``warnings`` itself skips the
    import system's frames (``importlib._bootstrap``); ours and ``importlib.import_module``'s count."""
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None:
        name = frame.f_code.co_filename
        if not ("importlib" in name and "_bootstrap" in name):
            if name != __file__ and frame.f_globals.get("__name__") != "importlib":
                break
            level += 1
        frame = frame.f_back
    return level


# Once per interpreter: a re-import of the package (pytester's in-process runs) replaces the finder.
sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "_MovedModules"]
sys.meta_path.insert(0, _MovedModules())


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
