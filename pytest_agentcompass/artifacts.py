"""Files a harness saves into the run directory while it runs (trajectories, agent logs).

The runtime installs a sink for the attempt being run (a context variable,
so concurrent tasks never mix); harnesses call :func:`save_artifact`.
Everything saved passes through the run's secret redaction.
"""

from __future__ import annotations

import contextvars
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

__all__ = ["ArtifactSink", "artifact_sink", "check_artifact_name", "save_artifact"]

_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


class ArtifactSink(Protocol):
    def save(self, name: str, data: bytes | str | Any) -> str:
        """Write ``data`` (bytes, text, or a JSON value) as ``name``; return the path relative to the run directory."""
        ...


_current: contextvars.ContextVar[ArtifactSink | None] = contextvars.ContextVar("agentcompass_artifacts", default=None)


def check_artifact_name(name: str) -> str:
    """``name`` as a relative path of safe parts; :raises ValueError: otherwise."""
    parts = name.split("/")
    if not all(_PART.match(part) for part in parts):
        raise ValueError(f"artifact name {name!r} must be a relative path of letters, digits, '.', '_', '-'")
    return name


def save_artifact(name: str, data: bytes | str | Any) -> str | None:
    """Save ``data`` for the attempt being run; ``None`` when no run directory is active."""
    sink = _current.get()
    return None if sink is None else sink.save(check_artifact_name(name), data)


@contextmanager
def artifact_sink(sink: ArtifactSink) -> Iterator[None]:
    token = _current.set(sink)
    try:
        yield
    finally:
        _current.reset(token)
