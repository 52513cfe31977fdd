"""The ``local`` provider: a private workspace directory and host subprocesses.

It isolates files, not the network: the only policy it can honour is
``full``, and it says so when a plan is built rather than pretending.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import os
import secrets
import shutil
import stat
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath

from pydantic import Field

from ..config import ConfigPath, ParamsModel
from ..errors import SessionError, WorkspacePathError
from ..runtime.threads import BlockingCallPool, shared_pool
from ..types import ExecResult
from .base import BaseEnvironment, EnvironmentSession, SessionConfig, argv_list
from .process import DEFAULT_OUTPUT_LIMIT, MARKER, ExecControls, kill_marked, run_reaped

__all__ = ["LocalEnvironment", "LocalSession", "DEFAULT_OUTPUT_LIMIT"]


class LocalSession(EnvironmentSession):
    """A workspace directory on the host.

    Paths are confined to the workspace: relative paths start there, and an
    absolute path such as ``/tmp/x`` means ``<workspace>/tmp/x``, so benchmark
    code written for containers keeps working. For the same reason an
    absolute path in an ``exec`` argument list that exists inside the
    workspace (``bash /opt/verifier/run.sh``) is rewritten to that file.
    """

    network_policy = "full"

    def __init__(
        self,
        root: Path | None = None,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
        run_id: str | None = None,
        *,
        parent: Path | None = None,
        prefix: str = "agentcompass",
    ) -> None:
        if root is None and parent is None:
            raise ValueError("LocalSession needs a root or a parent to name one under")
        self._root = root
        self._parent = parent
        self._prefix = prefix
        self.output_limit = output_limit
        self.run_id = run_id
        self._controls = ExecControls()
        self._closed = False
        # Created on first use: a task that never touches its workspace costs no
        # mkdir and no removal (that is most of the per-task cost at 10k tasks).
        self._created = False
        #: (device, inode) of the workspace directory as made: the one-name shortcut's premise.
        self._root_id: tuple[int, int] | None = None
        self._removal: asyncio.Future[None] | None = None

    @property
    def root(self) -> Path:
        """The workspace directory (named on first use; created by the first path that needs it)."""
        if self._root is None:
            assert self._parent is not None
            # Random, so no one can create it first in a shared temp dir. Under
            # a resolved parent: paths are checked against a root free of symlinks.
            self._root = _real_dir(self._parent) / f"{self._prefix}-{secrets.token_hex(8)}"
        return self._root

    def resolve(self, path: str) -> Path:
        """Map ``path`` into the workspace.

        :raises WorkspacePathError: when it (or a symlink on its way) leaves the workspace.
        """
        if self._closed:
            raise SessionError(f"workspace {self.root} is closed")
        if not self._created:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)  # exist_ok: a test may pass a made dir
            self._created = True
            self._root_id = _identity(self.root)
        if "/" not in path and path != ".." and self._root_id is not None and _identity(self.root) == self._root_id:
            # The common case, one name (``answer.txt``) in the directory made
            # above (not one a command put in its place: commands run with
            # HOME set to it): the root has no symlink on its way (see
            # ``root``), so only the name itself can lead out. Two ``lstat``s
            # instead of ``realpath``'s one per component of the whole path,
            # ten thousand times per run.
            if path in ("", "."):
                return self.root
            candidate = self.root / path
            try:
                if not stat.S_ISLNK(os.lstat(candidate).st_mode):
                    return candidate
            except FileNotFoundError:
                return candidate
            except OSError:
                pass  # the full check below says what is wrong
        relative = PurePosixPath(path)
        if relative.is_absolute():
            relative = relative.relative_to("/")
        candidate = (self.root / relative).resolve()
        if not candidate.is_relative_to(self.root):
            raise WorkspacePathError(f"path {path!r} is outside the workspace {self.root}")
        return candidate

    def _map_argument(self, arg: str) -> str:
        if not arg.startswith("/") or arg.startswith(str(self.root)):
            return arg
        candidate = self.root / arg.lstrip("/")
        if os.path.lexists(candidate) and candidate.resolve().is_relative_to(self.root):
            return str(candidate)
        return arg

    async def read_bytes(self, path: str) -> bytes:
        target = self.resolve(path)
        try:
            return target.read_bytes()
        except OSError as exc:
            raise SessionError(f"cannot read {path!r} in workspace {self.root}: {exc.strerror}") from None

    async def write_bytes(self, path: str, data: bytes) -> None:
        target = self.resolve(path)
        try:
            if target.parent != self.root:
                target.parent.mkdir(parents=True, exist_ok=True)
            try:
                target.write_bytes(data)
            except FileNotFoundError:  # a command removed the workspace itself: made again, as for a subfolder
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
        except OSError as exc:
            raise SessionError(f"cannot write {path!r} in workspace {self.root}: {exc.strerror or exc}") from None

    async def exec(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> ExecResult:
        args = argv_list(argv)
        workdir = self.resolve(cwd) if cwd else self.resolve(".")
        argv = [self._map_argument(arg) for arg in args]
        started = time.monotonic()
        environ = {**os.environ, "HOME": str(self.root), **(env or {})}
        if self.run_id:
            environ[MARKER] = self.run_id  # lets a resumed run find what a kill -9 left
        try:
            done = await run_reaped(
                argv,
                env=environ,
                cwd=str(workdir),
                timeout=timeout,
                output_limit=self.output_limit,
                controls=self._controls,
            )
        except OSError as exc:
            return ExecResult(exit_code=127, stderr=f"cannot run {argv[0]!r}: {exc.strerror}")
        return ExecResult(
            exit_code=done.returncode,
            stdout=done.stdout.decode("utf-8", "replace"),
            stderr=done.stderr.decode("utf-8", "replace"),
            timed_out=done.timed_out,
            stdout_truncated=done.stdout_truncated,
            stderr_truncated=done.stderr_truncated,
            duration=time.monotonic() - started,
        )

    async def close(self) -> None:
        self._closed = True
        await self._controls.kill_all()  # commands still running (an abandoned exec task) die here
        if not self._created:
            return
        if self._removal is None and _inline_removal.wanted():
            started = time.perf_counter()
            removed = _remove_flat(str(self.root), max_bytes=INLINE_REMOVAL_BYTES)
            _inline_removal.took(time.perf_counter() - started)
            if removed:
                self._created = False
                return
        removal = self._removal
        if removal is None or (removal.done() and not removal.cancelled() and removal.exception() is not None):
            # First close, or the one before could not remove everything: (try) again.
            removal = self._removal = asyncio.wrap_future(_removal_pool().submit(_remove_workspace, self.root))
        # Shielded: a cancelled close leaves the removal running, and the
        # next close waits for that same removal instead of racing it.
        await asyncio.shield(removal)  # raises SessionError naming what stays

    def describe(self) -> str:
        return str(self.root)


def _identity(path: Path) -> tuple[int, int] | None:
    """``(device, inode)`` of ``path`` itself when it is a directory (not a symlink to one), else ``None``."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return (info.st_dev, info.st_ino) if stat.S_ISDIR(info.st_mode) else None


@functools.lru_cache(maxsize=32)
def _real_dir(path: Path) -> Path:
    """``path`` resolved, once per process: every workspace of a run has the same parent."""
    return path.resolve()


#: Threads that remove workspaces, shared by every session of the process. Few
#: and long-lived: a burst of closing tasks queues here instead of starting a
#: thread each (a 1,000-task run used to start hundreds), and a slow disk makes
#: these threads wait, not the event loop (an ``rmdir`` took 1-3 ms on a busy ext4).
REMOVAL_THREADS = 8
_removals: BlockingCallPool | None = None


def _removal_pool() -> BlockingCallPool:
    # Shared: a run's loop waits for its removals at the end, also for tasks cancelled meanwhile.
    global _removals
    if _removals is None:
        _removals = shared_pool(REMOVAL_THREADS, "agentcompass-rm")
    return _removals


class _InlineRemoval:
    """Whether a small workspace is removed right on the event loop or by a removal thread.

    Removing one file and a directory takes tens of microseconds on a quick
    file system, and handing that to a thread and back cost far more CPU:
    threads taking the GIL from a busy loop in turns. Measured with 10,000
    tasks writing one file, 500 at a time, against tasks writing nothing:
    1.9x the CPU in threads against 1.15-1.2x inline on tmpfs, and on a busy
    ext4 1.7-1.8x in threads against 1.3-1.5x inline (docs/performance.md).
    Only when one removal holds the loop for milliseconds do threads pay for
    themselves, by letting those waits overlap. So removals run inline while
    their running mean stays under :attr:`LIMIT`, go to threads beyond it,
    and every :attr:`PROBE`-th removal tries inline again, to notice the
    disk calming down.
    """

    LIMIT = 0.002
    PROBE = 64

    def __init__(self) -> None:
        self.mean = 0.0
        self.skipped = 0

    def wanted(self) -> bool:
        if self.mean <= self.LIMIT:
            return True
        self.skipped += 1
        if self.skipped >= self.PROBE:
            self.skipped = 0
            return True
        return False

    def took(self, seconds: float) -> None:
        self.mean = 0.8 * self.mean + 0.2 * seconds


#: Process-wide, like the file systems it measures (only ever used on event-loop threads).
_inline_removal = _InlineRemoval()


#: Up to this many entries, none a directory, a workspace is removed with a
#: plain listing and ``unlink``s: fewer system calls than ``rmtree``'s walk.
FLAT_REMOVAL_ENTRIES = 16


def _remove_workspace(root: Path) -> None:
    """Remove ``root`` and everything in it.

    :raises SessionError: naming what stays.
    """
    if not _remove_flat(str(root)):
        _remove_tree(root)


#: A file larger than this is not removed on the event loop: freeing its blocks can take a while.
INLINE_REMOVAL_BYTES = 8 << 20


def _remove_flat(root: str, max_bytes: int | None = None) -> bool:
    """Remove ``root`` if it is small and flat; ``False`` leaves it (or what is left) to :func:`_remove_tree`.

    :param max_bytes: leave it also when a file is larger than this.
    """
    try:
        with os.scandir(root) as listing:
            entries = list(itertools.islice(listing, FLAT_REMOVAL_ENTRIES + 1))
        if len(entries) > FLAT_REMOVAL_ENTRIES or any(entry.is_dir(follow_symlinks=False) for entry in entries):
            return False
        if max_bytes is not None and any(e.stat(follow_symlinks=False).st_size > max_bytes for e in entries):
            return False
        for entry in entries:
            os.unlink(entry.path)
        os.rmdir(root)
    except FileNotFoundError:
        return not os.path.lexists(root)
    except OSError:
        return False  # _remove_tree tries again and says what stays
    return True


def _remove_tree(root: Path) -> None:
    """``rmtree`` that reports what it could not remove (a vanished path is not a failure).

    :raises SessionError: naming the first path left behind and how many there are.
    """
    failures: list[tuple[str, BaseException]] = []

    def failed(_function: object, path: str, exc_info: tuple[type[BaseException], BaseException, object]) -> None:
        if not isinstance(exc_info[1], FileNotFoundError):
            failures.append((path, exc_info[1]))

    shutil.rmtree(root, onerror=failed)
    if failures:
        path, exc = failures[0]
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        raise SessionError(f"workspace {root} was not removed: {path}: {reason}{more}")


class LocalParams(ParamsModel):
    """``environment.params`` of the ``local`` provider."""

    #: Where workspaces are created (default: the system temp dir).
    base_dir: ConfigPath | None = None
    #: A directory copied into every new workspace (the local stand-in for an image).
    template: ConfigPath | None = None
    #: Captured output kept per stream, in bytes.
    output_limit: int = Field(default=DEFAULT_OUTPUT_LIMIT, gt=0)


class LocalEnvironment(BaseEnvironment):
    """Opens :class:`LocalSession` workspaces under ``params.base_dir`` (default: the temp dir).

    ``params.template`` is a directory copied into every new workspace (the
    local stand-in for a container image: verifiers, fixtures);
    ``params.output_limit`` caps captured output per stream in bytes.
    """

    id = "local"
    params_model = LocalParams
    _workspace_parent: Path | None = None

    def _parent(self) -> Path:
        # Resolved once: realpath() per task is measurable at ten thousand tasks.
        if self._workspace_parent is None:
            base = self.spec.params.get("base_dir")
            self._workspace_parent = (self.rootdir / base if base else Path(tempfile.gettempdir())).resolve()
        return self._workspace_parent

    async def sweep(self, run_id: str) -> int:
        # Processes first: an agent still running would write into a workspace being removed.
        killed = await asyncio.to_thread(kill_marked, run_id)
        leftovers = list(self._parent().glob(f"agentcompass-{run_id}-*"))
        for path in leftovers:
            await asyncio.to_thread(shutil.rmtree, path, True)
        return killed + len(leftovers)

    async def open(self, config: SessionConfig) -> EnvironmentSession:
        # The run id in the name lets a resumed run sweep what a killed one left.
        run = config.labels.get("agentcompass.run", "norun")
        limit = int(self.spec.params.get("output_limit", DEFAULT_OUTPUT_LIMIT))
        session = LocalSession(
            output_limit=limit,
            run_id=config.labels.get("agentcompass.run"),
            parent=self._parent(),
            prefix=f"agentcompass-{run}-{config.task_id[:40]}",
        )
        template = self.spec.params.get("template")
        if template:
            template = self.rootdir / template
            session.resolve(".")  # create it now: the template is its content
            try:
                await asyncio.to_thread(shutil.copytree, template, session.root, dirs_exist_ok=True, symlinks=True)
            except BaseException:
                # Partial initialisation: remove what exists before re-raising.
                await session.close()
                raise
        return session
