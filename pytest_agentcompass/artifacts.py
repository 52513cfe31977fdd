"""Files a harness saves into the run directory while it runs (trajectories, agent logs).

The runtime installs a sink for the attempt being run (a context variable,
so concurrent tasks never mix); harnesses and benchmarks call
:func:`save_artifact`, or :func:`save_artifact_stream` for a file read from
a stream (a container's logs) with a cap on what is stored. Both land in
the try's own folder (``artifacts/<task>/attempt-<i>[-retry-<r>]/``).
Everything saved passes through the run's secret redaction.
"""

from __future__ import annotations

import contextvars
import hashlib
import re
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any, Protocol

__all__ = [
    "ArtifactSink",
    "artifact_name",
    "artifact_sink",
    "check_artifact_name",
    "save_artifact",
    "save_artifact_stream",
]

_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,199}$")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


class ArtifactSink(Protocol):
    def save(self, name: str, data: bytes | str | Any) -> str:
        """Write ``data`` (bytes, text, or a JSON value) as ``name``; return the path relative to the run directory."""
        ...

    def save_stream(self, name: str, handle: IO[bytes], limit: int) -> tuple[str, int]:
        """Write at most ``limit`` bytes read from ``handle`` as ``name``; return the path and the bytes stored."""
        ...


_current: contextvars.ContextVar[ArtifactSink | None] = contextvars.ContextVar("agentcompass_artifacts", default=None)


def check_artifact_name(name: str) -> str:
    """``name`` as a relative path of safe parts; :raises ValueError: otherwise."""
    parts = name.split("/")
    if not all(_PART.match(part) for part in parts):
        raise ValueError(f"artifact name {name!r} must be a relative path of letters, digits, '.', '_', '-'")
    return name


def artifact_name(path: str) -> str:
    """A safe artifact name for an arbitrary relative ``path`` (a file an agent named): each part keeps
    its letters, digits, ``.``, ``_`` and ``-`` (accents dropped, anything else ``_``); a part that had
    to change gets a short digest of the original, so two names never meet. ``name == path`` when
    ``path`` was safe already."""
    parts = []
    for part in path.strip("/").split("/"):
        if _PART.match(part) and part not in (".", ".."):
            parts.append(part)
            continue
        ascii_part = unicodedata.normalize("NFKD", part).encode("ascii", "ignore").decode()
        cleaned = _UNSAFE.sub("_", ascii_part).lstrip(".-")[:180] or "_"
        parts.append(f"{cleaned}-{hashlib.sha256(part.encode('utf-8', 'surrogateescape')).hexdigest()[:8]}")
    return "/".join(parts)


def save_artifact(name: str, data: bytes | str | Any) -> str | None:
    """Save ``data`` for the attempt being run; ``None`` when no run directory is active."""
    sink = _current.get()
    return None if sink is None else sink.save(check_artifact_name(name), data)


def save_artifact_stream(name: str, handle: IO[bytes], limit: int) -> tuple[str, int] | None:
    """Save at most ``limit`` bytes read from ``handle`` for the attempt being run, redacted like
    every artifact; returns the path (relative to the run directory) and the bytes stored, or
    ``None`` when no run directory is active. Nothing past ``limit`` is read."""
    sink = _current.get()
    return None if sink is None else sink.save_stream(check_artifact_name(name), handle, limit)


@contextmanager
def artifact_sink(sink: ArtifactSink) -> Iterator[None]:
    token = _current.set(sink)
    try:
        yield
    finally:
        _current.reset(token)
