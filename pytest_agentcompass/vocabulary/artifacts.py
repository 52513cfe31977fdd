"""Files components keep in the run directory, always written by the run's store.

An attempt's files (trajectories, agent logs): the runtime installs a sink
for the attempt being run (a context variable, so concurrent tasks never
mix); harnesses and benchmarks call :func:`save_artifact`, or
:func:`save_artifact_stream` for a file read from a stream (a container's
logs) with a cap on what is stored. Both land in the try's own folder
(``artifacts/<task>/attempt-<i>[-retry-<r>]/``).

A request's files (a provider's image build logs, shared by its tasks):
each component gets a :class:`RunFiles` from the runtime as ``run_files``.

Everything saved passes through the run's secret redaction.
"""

from __future__ import annotations

import contextvars
import hashlib
import re
import unicodedata
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import IO, Any, Protocol

__all__ = [
    "ArtifactSink",
    "RunFiles",
    "TextFile",
    "artifact_name",
    "artifact_sink",
    "check_artifact_name",
    "safe_slug",
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


class TextFile(Protocol):
    """A text file written piece by piece (a build log), redacted as it goes."""

    #: Where it is (for messages: "build log: <path>").
    path: Path

    def write(self, text: str) -> None: ...


class RunFiles(Protocol):
    """The request's own files in its run directory, written by the run's store.

    ``name`` is a relative path of safe parts (:func:`check_artifact_name`)
    outside the store's own files (``details/``, ``artifacts/``,
    ``summary.json``, ...), for instance ``images/<tag>.log``. Nothing a
    component writes there is counted or read back by the runtime.
    """

    def save(self, name: str, data: bytes | str | Any) -> str:
        """Write ``data`` (bytes, text, or a JSON value) as ``name``; return the path relative to the run directory."""
        ...

    def open_text(self, name: str) -> AbstractContextManager[TextFile]:
        """``name`` opened for writing text piece by piece (replacing what was there), closed with the block."""
        ...


_current: contextvars.ContextVar[ArtifactSink | None] = contextvars.ContextVar("agentcompass_artifacts", default=None)


def check_artifact_name(name: str) -> str:
    """``name`` as a relative path of safe parts; :raises ValueError: otherwise."""
    parts = name.split("/")
    if not all(_PART.match(part) for part in parts):
        raise ValueError(f"artifact name {name!r} must be a relative path of letters, digits, '.', '_', '-'")
    return name


def safe_slug(name: str, fill: str = "_") -> str:
    """``name`` made safe as a file name and a node id: accents dropped, every run of other
    characters than letters, digits, ``.``, ``_`` and ``-`` replaced by ``fill``, ends trimmed, and a
    short digest of ``name`` appended, so two names never share a slug and a name keeps its own."""
    ascii_name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
    slug = _UNSAFE.sub(fill, ascii_name).strip("._-")[:150] or "x"
    return f"{slug}-{hashlib.sha256(name.encode('utf-8', 'surrogateescape')).hexdigest()[:8]}"


def artifact_name(path: str) -> str:
    """A safe artifact name for an arbitrary relative ``path`` (a file an agent named): each part that
    is not a safe name already becomes :func:`safe_slug` of it. ``name == path`` when ``path`` was safe."""
    parts = path.strip("/").split("/")
    return "/".join(p if _PART.match(p) and p not in (".", "..") else safe_slug(p) for p in parts)


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
