"""The Harbor verifier's files in a task environment: its log folders, its tests, its copies.

With a session that offers trusted access (a Docker container, see
:func:`~pytest_agentcompass.environments.transfer.trusted`), nothing here
runs a program of the container: folders are made, replaced and read
through the engine's archive API, so an agent's ``mv``, ``rm`` or ``cat``
never runs on the runner's behalf. Copies out of the container go through
the run's artifact sink into the try's own folder
(``artifacts/<task>/attempt-<i>[-retry-<r>]/``), streamed, within a byte
cap and a time limit, names made safe (and the renames recorded).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from ...environments.base import EnvironmentSession
from ...environments.transfer import run_as_root, trusted, upload_tree
from ...vocabulary.artifacts import artifact_name, save_artifact, save_artifact_stream
from .rewards import REWARD_FILES, REWARD_MAX_BYTES

if TYPE_CHECKING:
    from ...environments.docker_files import Entry, TreeCopy, Watch

__all__ = [
    "LOG_DIRS",
    "VERIFIER_LOGS",
    "copy_folder",
    "make_log_dirs",
    "prepare_verifier",
    "read_reward_files",
    "save_text",
    "take_verifier_logs",
]

VERIFIER_LOGS = "/logs/verifier"
LOG_DIRS = ("/logs/verifier", "/logs/agent", "/logs/artifacts")


async def make_log_dirs(env: EnvironmentSession, dirs: Sequence[str] = LOG_DIRS) -> None:
    """Create ``dirs`` (mode 0777: an agent or verifier running as another user writes there too)."""
    access = trusted(env)
    if access is not None:
        await access.make_dirs(dirs, 0o777)
        return
    made = await run_as_root(env, ["sh", "-c", 'mkdir -p "$@" && chmod 777 "$@"', "sh", *dirs], timeout=60)
    if not made.ok:
        raise RuntimeError(f"cannot create {', '.join(dirs)} in the task environment: {made.stderr[-500:]}")


async def prepare_verifier(env: EnvironmentSession, tests: Path | None) -> None:
    """``/logs/verifier`` emptied (a reward the agent wrote never counts) and ``/tests`` made exactly
    the task's ``tests/`` (a ``/tests`` the agent made goes; ``tests`` ``None``: the verifier's image
    brings its own). In a container, with every process suspended meanwhile: what the agent left
    running cannot race the runner (it resumes afterwards, as shared mode keeps it)."""
    access = trusted(env)
    if access is None:
        await _prepare_with_tools(env, tests)
        return
    trees = [(VERIFIER_LOGS, None, 0o777), *([("/tests", tests, 0o755)] if tests is not None else [])]
    async with access.paused():
        try:
            # One engine request (sent again should a process the pause did not stop, on an engine
            # that cannot pause, write into /logs/verifier while the engine empties it).
            await access.replace_trees(trees)
        except Exception as exc:
            if "Error processing tar file" not in str(exc):
                raise  # the engine itself failed
            # What the container holds refused the change: the task's (or its agent's) doing.
            raise RuntimeError(f"cannot empty {VERIFIER_LOGS} and stage /tests for the verifier: {exc}") from None


async def _prepare_with_tools(env: EnvironmentSession, tests: Path | None) -> None:
    """For sessions without archive access: the same through the session's own tools."""
    done = await run_as_root(env, ["sh", "-c", f"rm -rf {VERIFIER_LOGS} /tests && mkdir -p -m 777 {VERIFIER_LOGS}"])
    if not done.ok:
        raise RuntimeError(f"cannot empty {VERIFIER_LOGS} for the verifier: {done.stderr[-500:]}")
    if tests is not None:
        await upload_tree(env, tests, "/tests")


async def copy_folder(
    env: EnvironmentSession,
    source: str,
    prefix: str,
    limit: int,
    time_limit: float | None,
    exclude: Sequence[str] = (),
) -> dict[str, Any]:
    """Copy the files under ``source`` (a folder, or one file) into the try's artifacts under ``prefix``.

    Returns what the task's record says of the copy: ``folder`` (in the run
    directory), ``files``, ``bytes``, ``read_bytes``, ``limit_bytes``,
    ``truncated``, ``cut`` (each file left out, its size and why), ``stopped``
    (why the copy ended early), and ``renamed`` (stored name -> the name in
    the container, for names that were not safe as file names here).
    """
    access = trusted(env)
    if access is None:
        return dict(_NO_COPY)
    copied, _ = await _copy(access, source, prefix, limit, time_limit, exclude)
    return copied


async def take_verifier_logs(
    env: EnvironmentSession, limit: int, time_limit: float | None
) -> tuple[dict[str, bytes | int | str], dict[str, Any]]:
    """The reward files (as :func:`read_reward_files` gives them) and the copy of ``/logs/verifier``
    (as :func:`copy_folder` records it), in one engine request: the copy's archive says what each
    reward file is. One the archive leaves unsaid (the copy stopped before it, ``/logs/verifier`` is
    no folder any more, or it is a second name of another file) is read on its own, as without the copy."""
    access = trusted(env)
    if access is None:  # no archive access: the session's own reads, and no copy
        return await read_reward_files(env), dict(_NO_COPY)
    watch = (("", *REWARD_FILES), REWARD_MAX_BYTES)
    copied, report = await _copy(access, VERIFIER_LOGS, "verifier/logs", limit, time_limit, watch=watch)
    seen = report.watched
    if not seen and not report.stopped:  # nothing at /logs/verifier: no reward file either
        return {}, copied
    whole = seen.get("") == "a folder" and not report.stopped
    found = {name: _reward_entry(entry) for name, entry in seen.items() if name and entry is not None}
    unsaid = [name for name in REWARD_FILES if seen.get(name) is None and (name in seen or not whole)]
    if unsaid:
        found.update(await read_reward_files(env, unsaid))
    return {name: found[name] for name in REWARD_FILES if name in found}, copied


#: What a copy records when the session offers no archive access.
_NO_COPY: dict[str, Any] = {
    "files": 0,
    "bytes": 0,
    "unavailable": "the session offers no archive access: nothing copied",
}


async def _copy(
    access: Any,
    source: str,
    prefix: str,
    limit: int,
    time_limit: float | None,
    exclude: Sequence[str] = (),
    watch: Watch | None = None,
) -> tuple[dict[str, Any], TreeCopy]:
    """:func:`copy_folder` through ``access``; also returns the copy's own report."""
    renamed: dict[str, str] = {}
    stored: list[tuple[str, str]] = []

    def save(name: str, handle: IO[bytes], size: int) -> int:
        safe = artifact_name(name)
        saved = save_artifact_stream(f"{prefix}/{safe}", handle, size)
        if saved is None:  # no run directory (the benchmark driven alone): nothing to keep
            return 0
        if safe != name:
            renamed[safe] = name
        stored.append((saved[0], safe))
        return saved[1]

    def skip(name: str) -> bool:
        return any(fnmatch.fnmatch(name, pattern) or name.startswith(pattern.rstrip("/") + "/") for pattern in exclude)

    report: TreeCopy = await access.copy_out(source, save, limit, time_limit, skip if exclude else None, watch)
    copied: dict[str, Any] = report.to_dict()
    if stored:
        path, name = stored[0]
        copied["folder"] = path[: -len(name) - 1]
        copied["stored"] = [safe for _, safe in stored]
    if renamed:
        copied["renamed"] = renamed
    return copied, report


async def read_reward_files(
    env: EnvironmentSession, names: Sequence[str] = REWARD_FILES
) -> dict[str, bytes | int | str]:
    """Those of ``names`` (``reward.txt`` and ``reward.json``) in ``/logs/verifier`` that exist: their
    bytes; their size when it is over :data:`REWARD_MAX_BYTES` (such a file is not read); or what they
    are instead of a regular file (a folder, a link: whoever made them, it is no reward)."""
    found: dict[str, bytes | int | str] = {}
    access = trusted(env)
    for name in names:
        path = f"{VERIFIER_LOGS}/{name}"
        if access is not None:  # one engine request per file
            entry = await access.read_entry(path, REWARD_MAX_BYTES)
            if entry is not None:
                found[name] = _reward_entry(entry)
            continue
        try:
            data, size = await env.read_head(path, REWARD_MAX_BYTES)
        except Exception:
            continue  # absent: the caller decides what a missing file means
        found[name] = size if size > REWARD_MAX_BYTES else data
    return found


def _reward_entry(entry: Entry) -> bytes | int | str:
    """What a reward file read through the engine counts as: its bytes, its size when too large, or
    ``"not a regular file (...)"``."""
    if isinstance(entry, str):
        return f"not a regular file ({entry})"
    data, size = entry
    return size if size > REWARD_MAX_BYTES else data


def save_text(name: str, text: str) -> str | None:
    """Keep ``text`` as the try's artifact ``name`` (redacted); its path in the run directory."""
    return save_artifact(name, text)
