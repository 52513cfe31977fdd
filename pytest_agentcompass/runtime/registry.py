"""Component ids -> classes.

An id is looked up, in order, among registered names (built-ins, the
``pytest_agentcompass.<kind>`` entry-point groups and the
``pytest_agentcompass_register`` hook), then as ``package.module:Class`` or
``path/to/file.py:Class`` relative to the rootdir.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
import traceback
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Literal

from ..harnesses.agents import AGENTS  # its names only: each agent's module loads when it is used
from ..vocabulary.errors import ComponentError
from ..vocabulary.types import USER_MODULE_PREFIX

__all__ = ["KINDS", "ComponentKind", "Registry"]

#: The built-in agent CLI harnesses (``harnesses/agents``: ``AGENTS`` names each one's module).
AGENT_IDS = tuple(AGENTS)

ComponentKind = Literal["benchmark", "harness", "environment", "strategy", "analyzer", "recipe"]
KINDS: tuple[ComponentKind, ...] = ("benchmark", "harness", "environment", "strategy", "analyzer", "recipe")


class _Lazy:
    """A registry entry loaded on first use (keeps heavy imports lazy)."""

    def __init__(self, load: Callable[[], Any]) -> None:
        self.load = load


def _builtins() -> dict[str, dict[str, Any]]:
    # Thunks keep heavy modules (docker, SDKs) out of an unrelated import.
    def harness_command() -> Any:
        from ..harnesses.command import CommandHarness

        return CommandHarness

    def harness_openai() -> Any:
        from ..harnesses.openai_chat import OpenAIChatHarness

        return OpenAIChatHarness

    def harness_shell_agent() -> Any:
        from ..harnesses.shell_agent import ShellAgentHarness

        return ShellAgentHarness

    def harness_oracle() -> Any:
        from ..harnesses.oracle import OracleHarness

        return OracleHarness

    def harness_nop() -> Any:
        from ..harnesses.nop import NopHarness

        return NopHarness

    def harness_agent(name: str) -> Callable[[], Any]:
        def load() -> Any:
            module, cls = AGENTS[name]
            return getattr(importlib.import_module(f"..harnesses.agents.{module}", __package__), cls)

        return load

    def benchmark_harbor() -> Any:
        from ..benchmarks.harbor import HarborBenchmark

        return HarborBenchmark

    def environment_local() -> Any:
        from ..environments.local import LocalEnvironment

        return LocalEnvironment

    def environment_docker() -> Any:
        from ..environments.docker import DockerEnvironment

        return DockerEnvironment

    def strategy(name: str) -> Callable[[], Any]:
        def load() -> Any:
            from .strategies import STRATEGIES

            return STRATEGIES[name]

        return load

    return {
        "benchmark": {"harbor": _Lazy(benchmark_harbor)},
        "harness": {
            "command": _Lazy(harness_command),
            "openai": _Lazy(harness_openai),
            "shell-agent": _Lazy(harness_shell_agent),
            "oracle": _Lazy(harness_oracle),
            "nop": _Lazy(harness_nop),
            **{name: _Lazy(harness_agent(name)) for name in AGENT_IDS},
        },
        "environment": {"local": _Lazy(environment_local), "docker": _Lazy(environment_docker)},
        "strategy": {"avg": _Lazy(strategy("avg")), "pass": _Lazy(strategy("pass"))},
        "analyzer": {},
        "recipe": {},
    }


def _is_file(target: str) -> bool:
    return target.endswith(".py") or "/" in target


def _raised_at(exc: BaseException, origin: Path | None) -> str:
    """``"file:line: "`` where ``exc`` was raised: the innermost frame in the user's
    module ``origin`` (where its own code went wrong), else the last frame.

    A location, not a traceback: the frames between are importlib's and ours.
    A ``SyntaxError`` already names its file and line.
    """
    if isinstance(exc, SyntaxError):
        return ""
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if origin is not None and Path(f.filename) == origin]
    if not (own or frames):
        return ""
    frame = (own or frames)[-1]
    return f"{frame.filename}:{frame.lineno}: "


class Registry:
    """Resolves component ids for one pytest session."""

    def __init__(self, rootdir: Path, config_dir: Path | None = None) -> None:
        self.rootdir = rootdir
        #: ``path/to/file.py:Class`` is looked for here first (the config file's folder), then in the rootdir.
        self.config_dir = config_dir
        self._entries = _builtins()
        self._entry_points_read = False

    def register(self, kind: ComponentKind, name: str, obj: Any) -> None:
        """Make ``obj`` (a class, a strategy, a recipe) known as ``name``."""
        if kind not in self._entries:
            raise ValueError(f"unknown component kind {kind!r}; expected one of {', '.join(KINDS)}")
        self._entries[kind][name] = obj

    def names(self, kind: ComponentKind) -> list[str]:
        self._read_entry_points()
        return sorted(self._entries[kind])

    def resolve(self, kind: ComponentKind, component_id: str, where: str = "") -> Any:
        """Return the class behind ``component_id``.

        :param where: Where the id came from, for the error message.
        :raises ComponentError: naming the id, its kind, the place and the known names.
        """
        suffix = f" ({where})" if where else ""
        entry = self._entries[kind].get(component_id)
        if entry is None and ":" not in component_id and not self._entry_points_read:
            self._read_entry_points()
            entry = self._entries[kind].get(component_id)
        if entry is not None:
            if isinstance(entry, _Lazy):
                entry = self._entries[kind][component_id] = entry.load()
            return entry
        if ":" not in component_id:
            known = ", ".join(self.names(kind)) or "none registered"
            raise ComponentError(
                f"unknown {kind} id {component_id!r}{suffix}; known {kind} ids: {known}; "
                "or use 'package.module:Class' / 'path/to/file.py:Class'"
            )
        target, _, attr = component_id.rpartition(":")
        try:
            module = self._import(target)
        except ComponentError as exc:
            raise ComponentError(f"{exc}{suffix}") from None
        except Exception as exc:
            at = _raised_at(exc, self._origin(target))
            raise ComponentError(
                f"cannot import {kind} {component_id!r}{suffix}: {at}{type(exc).__name__}: {exc}"
            ) from exc
        try:
            obj = getattr(module, attr)
        except AttributeError:
            raise ComponentError(f"{target!r} has no attribute {attr!r}{suffix}") from None
        return obj

    def _file_of(self, target: str) -> Path:
        """The file a ``path/to/file.py`` target names: next to the config, else under the rootdir."""
        path = Path(target)
        if not path.is_absolute():
            bases = list(dict.fromkeys(b for b in (self.config_dir, self.rootdir) if b is not None))
            tried = [(base / path).resolve() for base in bases]
            path = next((p for p in tried if p.is_file()), tried[0])
            if not path.is_file():
                raise ComponentError(f"no such file {target!r} (looked in {', '.join(str(b) for b in bases)})")
        path = path.resolve()
        if not path.is_file():
            raise ComponentError(f"no such file {path}")
        return path

    def _origin(self, target: str) -> Path | None:
        """The user's module file behind ``target``, after its import failed (None if unknown)."""
        try:
            if _is_file(target):
                return self._file_of(target)
            # Its parent packages are imported by now, so this finds the file without running it.
            spec = importlib.util.find_spec(target)
        except Exception:  # a parent package that failed itself: the last frame will do
            return None
        return Path(spec.origin) if spec is not None and spec.origin else None

    def _import(self, target: str) -> Any:
        if _is_file(target):
            path = self._file_of(target)
            name = USER_MODULE_PREFIX + hashlib.sha1(str(path).encode()).hexdigest()[:12] + "_" + path.stem
            if name in sys.modules:
                return sys.modules[name]
            spec = importlib.util.spec_from_file_location(name, path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[name]
                raise
            return module
        return importlib.import_module(target)

    def _read_entry_points(self) -> None:
        """Add installed packages' components, once, when an id is not built in or registered.

        Only then: reading every installed distribution's metadata is a few
        milliseconds per scan, and it was done once per kind at every start
        (35 ms of CPU with 125 distributions). Built-in and registered names
        win over an entry point of the same name.
        """
        if self._entry_points_read:
            return
        self._entry_points_read = True
        installed = entry_points()
        for kind in KINDS:
            for ep in installed.select(group=f"pytest_agentcompass.{kind}s"):
                self._entries[kind].setdefault(ep.name, _Lazy(ep.load))
