"""Running Harbor's verifier (``bash /tests/test.sh``) and the evidence around it.

The verifier runs as root in its environment's working directory. What
the runner itself does there goes through the engine (see
:mod:`.session_io`); the verifier is the task's own program. In the shared
mode, whatever the agent left running is still there: it is listed before
the verifier starts, the verifier's processes are watched while it runs
(one the agent stopped is flagged), and ``/tests`` is compared with the
task's tests afterwards. Each finding goes to ``metadata["integrity"]``
(see :mod:`.integrity`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Any

from ...environments.base import EnvironmentSession
from ...environments.transfer import run_as_root, trusted
from ...vocabulary.types import ExecResult
from .integrity import WORKDIR_CONFIG, finding, is_startup_code, path_dirs_of, path_findings

__all__ = ["VerifierRun", "agent_processes", "changed_path_findings", "run_verifier", "tail", "tests_findings"]

#: Characters of verifier output kept in the task detail.
TAIL_CHARS = 2000
#: Seconds between looks at the verifier's processes (shared mode).
WATCH_INTERVAL = 1.0
#: The verifier's command line: its processes are the ones under it.
VERIFIER_ARGV = ["bash", "/tests/test.sh"]
#: Bytes of /tests read back to compare with the task's tests.
_TESTS_LIMIT = 16 * 1024 * 1024


@dataclass
class VerifierRun:
    """The verifier's exec, and what was seen of its processes while it ran."""

    result: ExecResult
    findings: list[dict[str, Any]] = field(default_factory=list)


async def run_verifier(
    env: EnvironmentSession, timeout: float | None, environ: Mapping[str, str], *, watch: bool
) -> VerifierRun:
    """Run ``bash /tests/test.sh`` as root; ``watch``: flag a verifier process found stopped."""
    access = trusted(env) if watch else None
    seen: dict[int, str] = {}
    watcher = asyncio.ensure_future(_watch(access, seen)) if access is not None else None
    try:
        result = await run_as_root(env, VERIFIER_ARGV, timeout=timeout, environ=environ)
    finally:
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watcher
    run = VerifierRun(result)
    for pid, args in seen.items():
        run.findings.append(
            finding(
                "verifier-stopped",
                None,
                f"a process of the verifier was stopped (SIGSTOP) while it ran: pid {pid} `{args[:120]}`",
            )
        )
    return run


async def _watch(access: Any, stopped: dict[int, str]) -> None:
    """Note the verifier's own processes (its init and its shell, the ones running ``/tests/test.sh``)
    found stopped, until cancelled. Its children are left alone: a test may stop one on purpose."""
    while True:
        await asyncio.sleep(WATCH_INTERVAL)
        try:
            procs = await access.processes()
        except Exception:
            continue  # the container may be going; the verifier's own result says what happened
        for proc in procs:
            if proc.stopped and "/tests/test.sh" in proc.args:
                stopped.setdefault(proc.pid, proc.args)


async def agent_processes(env: EnvironmentSession) -> list[dict[str, Any]]:
    """A finding listing what the agent left running (the container's own init and keepalive aside)."""
    access = trusted(env)
    if access is None:
        return []
    procs = await access.processes()
    by_pid = {p.pid: p for p in procs}
    roots = {p.pid for p in procs if p.ppid not in by_pid}  # the container's init (its parent is outside)
    keepalive = {p.pid for p in procs if p.ppid in roots and p.args.startswith("sleep 2147483647")}
    left = [p for p in procs if p.pid not in roots and p.pid not in keepalive]
    if not left:
        return []
    listed = "; ".join(f"`{p.args[:80]}`" for p in left[:5]) + (f"; and {len(left) - 5} more" if len(left) > 5 else "")
    return [
        finding(
            "agent-processes",
            None,
            f"{len(left)} process(es) the agent started were running when the verifier started (shared mode "
            f"cannot keep them from changing the outcome): {listed}",
        )
    ]


async def changed_path_findings(env: EnvironmentSession, workdir: str) -> list[dict[str, Any]]:
    """Findings from what the agent changed relative to the image (``docker diff``), before the runner
    stages anything: replaced or shadowed tools, startup hooks, pytest changed, planted config."""
    access = trusted(env)
    if access is None:
        return []
    changes = await access.changes()
    path_dirs = path_dirs_of(await access.environ())
    suspects = path_findings(((c.kind, c.path) for c in changes), workdir, path_dirs)
    found = list(suspects.findings)
    for pth in suspects.pth:
        with contextlib.suppress(Exception):  # gone or not a file: nothing runs from it
            head, _ = await access.read_head(pth, 64 * 1024)
            if is_startup_code(head):
                found.append(finding("startup-hook", pth, f"{pth}: a .pth file that runs code whenever Python starts"))
    canonical: dict[str, str] = {}

    async def resolve(folder: str) -> str:
        if folder not in canonical:
            info = await access.stat(folder)
            canonical[folder] = str((info or {}).get("linkTarget") or folder).rstrip("/") or "/"
        return canonical[folder]

    for path, later in suspects.added_tools:
        name, own = PurePosixPath(path).name, await resolve(str(PurePosixPath(path).parent))
        for folder in later:
            if await resolve(folder) == own:
                continue  # /bin -> /usr/bin: the same folder
            if await access.stat(f"{folder}/{name}") is not None:
                message = f"{path} added: comes earlier on PATH than {folder}/{name}, which the verifier would run"
                found.append(finding("shadowed-tool", path, message))
                break
    return found


async def tests_findings(env: EnvironmentSession, tests: Path) -> list[dict[str, Any]]:
    """After a shared verifier: where ``/tests`` no longer holds the task's tests (something rewrote
    them while they ran), or holds a file pytest would load that the task does not ship."""
    access = trusted(env)
    if access is None:
        return []
    seen: dict[str, bytes] = {}

    def keep(name: str, handle: IO[bytes], size: int) -> int:
        seen[name] = handle.read(size)
        return size

    await access.copy_out("/tests", keep, _TESTS_LIMIT, 30.0)
    found = []
    for file in sorted(p for p in tests.rglob("*") if p.is_file()):
        rel = file.relative_to(tests).as_posix()
        if file.is_symlink():  # staged as a link (its target, a file of tests/, is compared itself)
            if not await _same_link(access, file, rel):
                message = f"/tests/{rel} is no longer the task's link to {os.readlink(file)} after the verifier ran"
                found.append(finding("tests-modified", f"/tests/{rel}", message))
            continue
        if seen.get(rel) != file.read_bytes():
            state = "is gone" if rel not in seen else "differs from the task's"
            found.append(finding("tests-modified", f"/tests/{rel}", f"/tests/{rel} {state} after the verifier ran"))
    for rel in sorted(set(seen) - {p.relative_to(tests).as_posix() for p in tests.rglob("*") if p.is_file()}):
        name = PurePosixPath(rel).name
        if name in WORKDIR_CONFIG or name.endswith(".pth") or (name.endswith(".py") and "__pycache__" not in rel):
            message = f"/tests/{rel} appeared while the verifier ran (the task ships no such file)"
            found.append(finding("tests-modified", f"/tests/{rel}", message))
    return found


async def _same_link(access: Any, file: Path, rel: str) -> bool:
    """Whether ``/tests/<rel>`` is still the link ``file`` is (the engine names its target
    as written or resolved, depending on its version)."""
    info = await access.stat(f"/tests/{rel}")
    if info is None:
        return False
    written = os.readlink(file)
    resolved = posixpath.normpath(posixpath.join("/tests", posixpath.dirname(rel), written))
    return str(info.get("linkTarget") or "") in (written, resolved)


def tail(text: str, size: int = TAIL_CHARS) -> str:
    return text if len(text) <= size else "..." + text[-size:]
