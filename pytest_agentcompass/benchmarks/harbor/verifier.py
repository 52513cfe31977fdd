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
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Any

from ...environments.base import EnvironmentSession
from ...environments.transfer import run_as_root, trusted
from ...vocabulary.types import ExecResult
from .integrity import (
    RULES,
    WORKDIR_CONFIG,
    capped,
    configures_pytest,
    finding,
    git_commands,
    is_startup_code,
    path_dirs_of,
    path_findings,
    python_path_of,
)

__all__ = [
    "VerifierRun",
    "agent_processes",
    "changed_path_findings",
    "exposed_secrets",
    "listed",
    "processes_left",
    "run_verifier",
    "shadowing_modules",
    "tail",
    "tests_findings",
]

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
    left = await processes_left(env)
    if not left:
        return []
    return [
        finding(
            "agent-processes",
            None,
            f"{len(left)} process(es) the agent started were running when the verifier started (shared mode "
            f"cannot keep them from changing the outcome): {listed(left)}",
        )
    ]


#: Findings of code the verifier may run (or that runs beside it): whatever it is can read the
#: verifier's environment. The planted /tests and reward the runner replaces are not among them.
_RUNS_CODE = frozenset(RULES) - {"planted-tests", "planted-verifier-logs"} | {"agent-processes"}


def exposed_secrets(verifier_env: Mapping[str, str], findings: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """A ``secrets-exposed`` finding when the verifier is handed secrets (``[verifier.env]`` values
    taken from the host's environment) and ``findings`` say code of the agent's runs in or beside it:
    processes it left (shared mode), or a replaced tool, hook or module the diff found (any mode)."""
    secrets = sorted(k for k, v in verifier_env.items() if "${" in v)
    why = sorted({str(f["check"]) for f in findings if f.get("check") in _RUNS_CODE})
    if not secrets or not why:
        return []
    advice = (
        "verify such a task in mode 'separate' (no file or process of the agent's reaches its verifier) or "
        "'snapshot' (no process of the agent's survives)"
        if why == ["agent-processes"]
        else "only mode 'separate' keeps what the agent wrote away from its verifier"
    )
    message = (
        f"the verifier's environment holds secrets from [verifier.env] ({', '.join(secrets)}) and code the agent "
        f"placed runs in or beside it ({', '.join(why)}), which can read them (its environment, "
        f"/proc/<pid>/environ): {advice}"
    )
    return [finding("secrets-exposed", None, message)]


def listed(procs: Sequence[Any]) -> str:
    """A few processes' command lines, for a message."""
    return "; ".join(f"`{p.args[:80]}`" for p in procs[:5]) + (f"; and {len(procs) - 5} more" if len(procs) > 5 else "")


async def processes_left(env: EnvironmentSession) -> list[Any]:
    """The processes of ``env`` the agent started (all but the container's init and keepalive)."""
    access = trusted(env)
    if access is None:
        return []
    procs = await access.processes()
    # The runner's own processes (the container's init and keepalive) by the pids recorded when the
    # container started: a process of the agent may call itself anything, "sleep 2147483647" too.
    own: frozenset[int] = getattr(env, "runner_pids", frozenset())
    if not own:  # none recorded (a config set record_pids: false): the init, and one keepalive under it
        by_pid = {p.pid for p in procs}
        inits = {p.pid for p in procs if p.ppid not in by_pid}  # its parent is outside the container
        keepalive = getattr(env, "keepalive", None)
        # Exactly one process under the init is the runner's keepalive: any copy the agent started is its own.
        first = min((p.pid for p in procs if p.ppid in inits and p.args == keepalive), default=None)
        own = frozenset(inits | ({first} if first is not None else set()))
    return [p for p in procs if p.pid not in own]


async def changed_path_findings(env: EnvironmentSession, workdir: str) -> list[dict[str, Any]]:
    """Findings from what the agent changed relative to the image (``docker diff``), before the runner
    stages anything: every change of a class of paths that can run code in the verifier or decide its
    outcome (see :mod:`.integrity`). The compiled caches the agent wrote are blanked meanwhile (Python
    compiles their sources again), so none of them can carry code its source does not show."""
    access = trusted(env)
    if access is None:
        return []
    changes = await access.changes()
    environ = await access.environ()
    path_dirs = path_dirs_of(environ)
    python_dirs = python_path_of(environ)
    suspects = path_findings(((c.kind, c.path) for c in changes), workdir, path_dirs, python_dirs)
    found = list(suspects.findings)
    if suspects.caches:
        await access.blank_files(suspects.caches)
    for pth in suspects.pth:
        with contextlib.suppress(Exception):  # gone or not a file: nothing runs from it
            head, _ = await access.read_head(pth, 64 * 1024)
            if is_startup_code(head):
                found.append(finding("startup-hook", pth, f"{pth}: a .pth file that runs code whenever Python starts"))
            else:
                message = f"{pth}: a .pth file that adds folders to Python's import path"
                found.append(finding("python-path", pth, message))
    for config in suspects.workdir_configs:
        with contextlib.suppress(Exception):
            head, _ = await access.read_head(config, 256 * 1024)
            if configures_pytest(head):
                message = f"{config}: configures pytest in the verifier's working directory"
                found.append(finding("planted-config", config, message))
    for config in suspects.git_configs:
        with contextlib.suppress(Exception):  # read through the engine: never with the container's own tools
            head, _ = await access.read_head(config, 256 * 1024)
            keys = git_commands(head)
            if keys:
                runs = "which git runs as a command (or reads as more configuration)"
                message = f"{config}: sets {', '.join(keys[:5])}, {runs}"
                found.append(finding("git-command", config, message))
    found += await shadowing_modules(access, suspects.workdir_modules, python_dirs)
    canonical: dict[str, str] = {}

    async def resolve(folder: str) -> str:
        if folder not in canonical:
            info = await access.stat(folder)
            canonical[folder] = str((info or {}).get("linkTarget") or folder).rstrip("/") or "/"
        return canonical[folder]

    for path, later in suspects.added_tools:
        name, own = PurePosixPath(path).name, await resolve(str(PurePosixPath(path).parent))
        shadowed = None
        for folder in later:
            if await resolve(folder) == own:
                continue  # /bin -> /usr/bin: the same folder
            if await access.stat(f"{folder}/{name}") is not None:
                shadowed = folder
                break
        if shadowed is not None:
            message = f"{path} added: comes earlier on PATH than {shadowed}/{name}, which the verifier would run"
            found.append(finding("shadowed-tool", path, message))
        else:
            found.append(finding("path-program", path, f"{path} added: {RULES['path-program'].why}"))
    return capped(found)


#: Modules the verifier's pytest imports when they are there (absent, a file of that name still loads).
_OPTIONAL_IMPORTS = frozenset({"pygments", "argcomplete", "colorama", "tomli", "exceptiongroup", "py", "packaging"})
#: Python versions whose folders are looked for in a container.
_VERSIONS = ("2.7", *(f"3.{minor}" for minor in range(6, 16)))


async def shadowing_modules(
    access: Any, modules: Sequence[tuple[str, str]], python_dirs: Sequence[str]
) -> list[dict[str, Any]]:
    """Findings for the Python files of the working directory that shadow a module: one of the
    standard library, one pytest imports when present, or one installed in the container. A module
    of the task's own (the solution it asked for) shadows nothing and is no finding."""
    found: list[dict[str, Any]] = []
    if not modules:
        return found
    folders: list[str] | None = None
    stdlib = set(getattr(sys, "stdlib_module_names", ()))
    for path, name in modules:
        where = None
        if name in stdlib or name in _OPTIONAL_IMPORTS:
            where = "the standard library" if name in stdlib else "a module pytest imports when it is there"
        else:
            if folders is None:
                folders = [*await _python_folders(access), *python_dirs]
            for folder in folders:
                for candidate in (f"{folder}/{name}.py", f"{folder}/{name}"):
                    if await access.stat(candidate) is not None:
                        where = candidate
                        break
                if where:
                    break
        if where is not None:
            message = f"{path}: shadows {where} for `python -m pytest` ({RULES['shadowing-module'].why})"
            found.append(finding("shadowing-module", path, message))
    return found


async def _python_folders(access: Any) -> list[str]:
    """The import folders of the Pythons a container has (its standard libraries and packages)."""
    folders: list[str] = []
    for version in _VERSIONS:
        for prefix in ("/usr/lib", "/usr/local/lib"):
            base = f"{prefix}/python{version}"
            if await access.stat(base) is not None:
                folders += [base, f"{base}/lib-dynload", f"{base}/site-packages", f"{base}/dist-packages"]
                folders.append(f"/root/.local/lib/python{version}/site-packages")
    return [*folders, "/usr/lib/python3/dist-packages"]


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
