"""The ``local`` provider: a private workspace directory and host subprocesses.

It isolates files, not the network: the only policy it can honour is
``full``, and it says so when a plan is built rather than pretending.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
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
from ..vocabulary.errors import SessionError, WorkspacePathError
from ..vocabulary.types import ExecResult
from .base import BaseEnvironment, EnvironmentSession, HostRoute, SessionConfig, argv_list
from .markers import MARKER, PROCESS_MARKER, host_environment, kill_marked, this_process
from .process import DEFAULT_OUTPUT_LIMIT, ExecControls, run_reaped
from .workspaces import (
    INLINE_REMOVAL_BYTES,
    Identity,
    Spares,
    identity,
    inline_removal,
    removal_pool,
    remove_flat,
    remove_spares,
    remove_workspace,
)

__all__ = ["LocalEnvironment", "LocalSession", "DEFAULT_OUTPUT_LIMIT"]


class LocalSession(EnvironmentSession):
    """A workspace directory on the host.

    Paths are confined to the workspace: relative paths start there, and an
    absolute path such as ``/tmp/x`` means ``<workspace>/tmp/x``, so benchmark
    code written for containers keeps working. For the same reason an
    absolute path in an ``exec`` argument list that exists inside the
    workspace (``bash /opt/verifier/run.sh``) is rewritten to that file.

    Commands get a clean environment, as in a container: ``HOME`` is the
    workspace, and of pytest's own variables only ``PATH``, the locale and a
    few more (:func:`.markers.host_environment`) plus those ``pass_env`` names.
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
        spares: Spares | None = None,
        pass_env: Sequence[str] = (),
    ) -> None:
        if root is None and parent is None:
            raise ValueError("LocalSession needs a root or a parent to name one under")
        self._root = root
        self._parent = parent
        self._prefix = prefix
        self.output_limit = output_limit
        self.run_id = run_id
        self.pass_env = tuple(pass_env)
        self._controls = ExecControls()
        self._closed = False
        # Created on first use: a task that never touches its workspace costs no
        # mkdir and no removal (that is most of the per-task cost at 10k tasks).
        self._created = False
        #: (device, inode) of the workspace directory as made: the one-name shortcut's premise.
        self._root_id: Identity | None = None
        self._removal: asyncio.Future[None] | None = None
        #: Emptied workspaces of the same provider: the first use renames one instead of a mkdir.
        self._spares = spares

    @property
    def root(self) -> Path:
        """The workspace directory (named on first use; created by the first path that needs it)."""
        if self._root is None:
            assert self._parent is not None
            # Random, so no one can create it first in a shared temp dir. Under
            # a resolved parent: paths are checked against a root free of symlinks.
            # The process's name in it: a run that overran its cleanup grace removes its own only.
            self._root = _real_dir(self._parent) / f"{self._prefix}-{this_process()}-{secrets.token_hex(8)}"
        return self._root

    def resolve(self, path: str) -> Path:
        """Map ``path`` into the workspace.

        :raises WorkspacePathError: when it (or a symlink on its way) leaves the workspace.
        """
        if self._closed:
            raise SessionError(f"workspace {self.root} is closed")
        first_use = not self._created
        if first_use:
            if self._spares is None or not self._spares.take(self.root):
                try:
                    # A name of ours must be new (a test may pass a made dir as root).
                    self.root.mkdir(mode=0o700, parents=True, exist_ok=self._parent is None)
                except OSError as exc:
                    raise SessionError(f"cannot make workspace {self.root}: {exc.strerror or exc}") from None
            self._created = True
            self._root_id = identity(self.root)
        if (
            "/" not in path
            and path != ".."
            and self._root_id is not None
            and (first_use or identity(self.root) == self._root_id)
        ):
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
        environ = {**host_environment(self.pass_env), "HOME": str(self.root), **(env or {})}
        if self.run_id:
            environ[MARKER] = self.run_id  # lets a resumed run find what a kill -9 left
            environ[PROCESS_MARKER] = f"{self.run_id}/{this_process()}"  # and this process what it left
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
            stdout=done.stdout,
            stderr=done.stderr,
            timed_out=done.timed_out,
            stdout_truncated=done.stdout_truncated,
            stderr_truncated=done.stderr_truncated,
            duration=time.monotonic() - started,
            stdout_omitted=done.stdout_omitted,
            stderr_omitted=done.stderr_omitted,
        )

    async def close(self) -> None:
        self._closed = True
        # Commands still running (an abandoned exec task) die here; if one
        # might not have, its working directory is not handed to another task.
        if not await self._controls.kill_all():
            self._spares = None
        if not self._created:
            return
        if self._removal is None and inline_removal.wanted():
            started = time.perf_counter()
            removed = remove_flat(
                str(self.root), max_bytes=INLINE_REMOVAL_BYTES, spares=self._spares, made=self._root_id
            )
            inline_removal.took(time.perf_counter() - started)
            if removed:
                self._created = False
                return
        removal = self._removal
        if removal is None or (removal.done() and not removal.cancelled() and removal.exception() is not None):
            # First close, or the one before could not remove everything: (try) again.
            removal = self._removal = asyncio.wrap_future(
                removal_pool().submit(remove_workspace, self.root, self._spares, self._root_id)
            )
        # Shielded: a cancelled close leaves the removal running, and the
        # next close waits for that same removal instead of racing it.
        await asyncio.shield(removal)  # raises SessionError naming what stays

    def describe(self) -> str:
        return str(self.root)


@functools.lru_cache(maxsize=32)
def _real_dir(path: Path) -> Path:
    """``path`` resolved, once per process: every workspace of a run has the same parent."""
    return path.resolve()


class LocalParams(ParamsModel):
    """``environment.params`` of the ``local`` provider."""

    #: Where workspaces are created (default: the system temp dir).
    base_dir: ConfigPath | None = None
    #: A directory copied into every new workspace (the local stand-in for an image).
    template: ConfigPath | None = None
    #: Captured output kept per stream, in bytes.
    output_limit: int = Field(default=DEFAULT_OUTPUT_LIMIT, gt=0)
    #: Variables of pytest's environment that commands see besides ``PATH``, the locale and
    #: the like: names or shell-style patterns (``["PYTHONPATH", "CUDA_*"]``). None by default.
    pass_env: list[str] = Field(default_factory=list)
    #: Rename an emptied small workspace into the next one instead of a rmdir and a mkdir
    #: (``false``: every workspace is a new directory; see docs/how-it-works.md).
    reuse_workspaces: bool = True


class LocalEnvironment(BaseEnvironment):
    """Opens :class:`LocalSession` workspaces under ``params.base_dir`` (default: the temp dir).

    ``params.template`` is a directory copied into every new workspace (the
    local stand-in for a container image: verifiers, fixtures);
    ``params.output_limit`` caps captured output per stream in bytes;
    ``params.pass_env`` names the host variables commands see beyond the base set;
    ``params.reuse_workspaces: false`` makes every workspace a new directory.
    """

    id = "local"
    params_model = LocalParams
    _workspace_parent: Path | None = None
    _spares: Spares | None = None

    def _parent(self) -> Path:
        # Resolved once: realpath() per task is measurable at ten thousand tasks.
        if self._workspace_parent is None:
            base = self.spec.params.get("base_dir")
            self._workspace_parent = (self.rootdir / base if base else Path(tempfile.gettempdir())).resolve()
        return self._workspace_parent

    async def host_route(self, session: EnvironmentSession) -> HostRoute:
        """Host processes reach a server of this process on loopback."""
        return HostRoute(listen="127.0.0.1", host="127.0.0.1")

    async def sweep(self, run_id: str) -> int:
        return await self._sweep(f"agentcompass-{run_id}-*", run_id, MARKER)

    async def sweep_own(self, run_id: str) -> int:
        process = this_process()
        return await self._sweep(f"agentcompass-{run_id}-*-{process}-*", f"{run_id}/{process}", PROCESS_MARKER)

    async def _sweep(self, pattern: str, marked: str, marker: str) -> int:
        """Kill the processes whose ``marker`` is ``marked``, then remove the workspaces named ``pattern``."""
        # Processes first: an agent still running would write into a workspace being removed.
        killed = await asyncio.to_thread(kill_marked, marked, marker)
        leftovers = list(self._parent().glob(pattern))
        for path in leftovers:
            # The same removal as a close's: a link or a FIFO left in a
            # workspace's place goes itself (rmtree would open a FIFO and wait).
            with contextlib.suppress(SessionError):  # best effort, as before a resume
                await asyncio.to_thread(remove_workspace, path)
        return killed + len(leftovers)

    def _spares_in_use(self) -> Spares | None:
        if not self.spec.params.get("reuse_workspaces", True):
            return None
        if self._spares is None:
            self._spares = Spares()
        self._spares.reopen()
        return self._spares

    async def aclose(self) -> None:
        try:
            # At once, not in the thread: a close still to come (a cancelled task's) keeps none.
            left = self._spares.close() if self._spares is not None else []
            if left:
                # In a removal thread (a slow disk), shielded: an aclose cut
                # short by the grace leaves it running, and the run's loop
                # waits for the removal pools before it ends.
                await asyncio.shield(asyncio.wrap_future(removal_pool().submit(remove_spares, left)))
        finally:
            await super().aclose()

    async def open(self, config: SessionConfig) -> EnvironmentSession:
        # The run id in the name lets a resumed run sweep what a killed one left.
        run = config.labels.get("agentcompass.run", "norun")
        limit = int(self.spec.params.get("output_limit", DEFAULT_OUTPUT_LIMIT))
        session = LocalSession(
            output_limit=limit,
            run_id=config.labels.get("agentcompass.run"),
            parent=self._parent(),
            prefix=f"agentcompass-{run}-{config.task_id[:40]}",
            spares=self._spares_in_use(),
            pass_env=self.spec.params.get("pass_env", ()),
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
