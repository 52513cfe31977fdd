"""Helpers over any :class:`~.base.EnvironmentSession`: folders in, commands as root, trusted access.

A provider that can do better than the generic contract says so with
methods of its own (the ``docker`` session's :class:`~.docker_trusted.TrustedAccess`):
these helpers use them where they exist and fall back to ``exec`` and
``write_bytes`` elsewhere.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from ..vocabulary.types import ExecResult
from .base import EnvironmentSession

__all__ = ["run_as_root", "trusted", "upload_tree"]


def trusted(env: EnvironmentSession) -> Any | None:
    """``env`` when it moves files and reads its own state without running the session's tools
    (archive I/O, a diff against its image, its processes: a Docker container), else ``None``."""
    return env if callable(getattr(env, "replace_tree", None)) else None


async def run_as_root(
    env: EnvironmentSession,
    argv: list[str],
    *,
    timeout: float | None = None,
    environ: Mapping[str, str] | None = None,
) -> ExecResult:
    """``exec`` as root where the session can choose the user (Docker), else as the session's user."""
    if callable(getattr(env, "put_tree", None)):  # the docker session's exec takes ``user``
        return await env.exec(argv, timeout=timeout, env=environ, user="0")  # type: ignore[call-arg]
    return await env.exec(argv, timeout=timeout, env=environ)


async def upload_tree(env: EnvironmentSession, source: Path, target: str) -> None:
    """Copy the local folder ``source`` to ``target`` in the session (files there are overwritten)."""
    put_tree = getattr(env, "put_tree", None)
    if put_tree is not None:
        await put_tree(source, target)
        return
    for root, _, files in os.walk(source):
        for name in files:
            path = Path(root, name)
            rel = path.relative_to(source).as_posix()
            await env.write_bytes(str(PurePosixPath(target) / rel), path.read_bytes())
