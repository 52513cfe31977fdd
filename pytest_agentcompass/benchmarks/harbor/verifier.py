"""Harbor's verifier step and reward files, and moving folders in and out of a session.

The verifier is ``bash /tests/test.sh``, run as root in the image's WORKDIR
after ``tests/`` was copied to ``/tests``. It reports through
``/logs/verifier/reward.txt`` (one number) or ``reward.json`` (named
numbers). Anything else (no file, an empty one, a word, a timeout) is an
evaluation error carrying the exit code and the output tail: never a 0.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from ...environments.base import EnvironmentSession
from ...redact import Redactor
from ...types import ExecResult

__all__ = [
    "RewardError",
    "Rewards",
    "fetch_tree",
    "parse_rewards",
    "redact_bytes",
    "run_as_root",
    "save_tree",
    "upload_tree",
]

VERIFIER_LOGS = "/logs/verifier"
LOG_DIRS = ("/logs/verifier", "/logs/agent", "/logs/artifacts")
#: Characters of verifier output kept in the task detail.
TAIL_CHARS = 2000


class RewardError(ValueError):
    """The verifier left no usable reward."""


@dataclass(frozen=True)
class Rewards:
    """A verifier's verdict: the task ``score`` and every named number it reported."""

    score: float
    values: Mapping[str, float] = field(default_factory=dict)
    source: str = "reward.txt"


def parse_rewards(txt: bytes | None, js: bytes | None, key: str | None = None) -> Rewards:
    """Read ``reward.txt`` (preferred, as Harbor does) or ``reward.json``.

    ``reward.json``'s score is ``key`` when given, else its ``reward`` entry,
    else the mean of its numbers.

    :raises RewardError: naming what is missing or malformed.
    """
    if txt is not None:
        text = txt.decode("utf-8", "replace").strip()
        if not text:
            raise RewardError("reward.txt is empty")
        try:
            value = float(text)
        except ValueError:
            raise RewardError(f"reward.txt holds {text[:80]!r}, not a number") from None
        if not math.isfinite(value):
            raise RewardError(f"reward.txt holds {text[:80]!r}, not a finite number")
        return Rewards(value, {"reward": value})
    if js is None:
        raise RewardError(f"the verifier wrote neither {VERIFIER_LOGS}/reward.txt nor {VERIFIER_LOGS}/reward.json")
    try:
        data = json.loads(js.decode("utf-8", "replace") or "null")
    except json.JSONDecodeError as exc:
        raise RewardError(f"reward.json is not JSON: {exc}") from None
    if not isinstance(data, Mapping):
        raise RewardError(f"reward.json must hold an object of named numbers, not {type(data).__name__}")
    values = {
        str(k): float(v)
        for k, v in data.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }
    if key is not None:
        if key not in values:
            raise RewardError(f"reward.json has no number named {key!r} (the benchmark's reward_key)")
        return Rewards(values[key], values, "reward.json")
    if "reward" in values:
        return Rewards(values["reward"], values, "reward.json")
    if not values:
        raise RewardError("reward.json holds no numbers")
    return Rewards(sum(values.values()) / len(values), values, "reward.json")


async def run_as_root(
    env: EnvironmentSession,
    argv: list[str],
    *,
    timeout: float | None = None,
    environ: Mapping[str, str] | None = None,
) -> ExecResult:
    """``exec`` as root where the session can choose the user (Docker), else as the session's user."""
    if hasattr(env, "put_tree"):  # the docker session's exec takes ``user``
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


async def fetch_tree(
    env: EnvironmentSession, source: str, limit: int, wanted: tuple[str, ...] = ()
) -> tuple[dict[str, bytes], bool]:
    """The files under ``source`` in the session (at most ``limit`` bytes) and whether some were left out.

    Where the session cannot list a folder, only the ``wanted`` names are read.
    """
    get_tree = getattr(env, "get_tree", None)
    if get_tree is not None:
        return await get_tree(source, limit)  # type: ignore[no-any-return]
    files: dict[str, bytes] = {}
    for name in wanted:
        try:
            files[name] = await env.read_bytes(str(PurePosixPath(source) / name))
        except Exception:
            continue  # absent: the caller decides what a missing file means
    return files, False


def save_tree(files: Mapping[str, bytes], target: Path, limit: int, truncated: bool) -> dict[str, Any]:
    """Write ``files`` under ``target``; returns ``files``, ``bytes``, ``limit_bytes``, ``truncated``."""
    total = 0
    root = target.resolve()
    for name, data in files.items():
        destination = (target / name).resolve()
        if not destination.is_relative_to(root):
            continue  # a crafted archive name must not escape the run directory
        destination.parent.mkdir(parents=True, exist_ok=True)
        destination.write_bytes(redact_bytes(data))
        total += len(data)
    return {"files": len(files), "bytes": total, "limit_bytes": limit, "truncated": truncated}


def redact_bytes(data: bytes) -> bytes:
    """``data`` with the run's secrets masked when it is text (a task's ``${VAR}`` env values
    may be printed by its scripts); other bytes as they are."""
    redactor = Redactor()
    if not redactor:
        return data
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return data
    return redactor.text(text).encode("utf-8")


def tail(text: str, size: int = TAIL_CHARS) -> str:
    return text if len(text) <= size else "..." + text[-size:]
