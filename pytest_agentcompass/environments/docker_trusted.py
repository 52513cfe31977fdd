"""What a ``docker`` session does without running anything inside its container.

A verifier's runner must not depend on the container's tools (an agent may
have replaced ``sh``, ``mv`` or ``cat``): files move through the engine's
archive API (:mod:`.docker_files`) and the container's state comes from the
engine (:mod:`.docker_state`). :class:`TrustedAccess` gives
:class:`~.docker_session.DockerSession` these as coroutines; each runs its blocking
SDK call in a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import posixpath
from collections.abc import AsyncIterator, Iterable
from typing import Any

from ..vocabulary.errors import SessionError
from .docker_files import (
    Save,
    Skip,
    Tree,
    TreeCopy,
    Watch,
    blank_files,
    copy_out,
    make_dirs,
    read_entry,
    read_head,
    replace_tree,
    replace_trees,
    stat,
)
from .docker_state import Change, Process, Snapshots, changes, environ, freeze, pause, processes, resume

__all__ = ["TrustedAccess"]

log = logging.getLogger("pytest_agentcompass")


class TrustedAccess:
    """Mixin of :class:`~.docker_session.DockerSession`: archive I/O and the engine's view of the container."""

    container: Any
    #: The provider's snapshots, and this session's key in them (``(task id, attempt)``).
    snapshots: Snapshots | None = None
    snapshot_key: tuple[str, int] | None = None
    #: Bytes of changes a snapshot may hold (``snapshot_limit_mb``).
    snapshot_limit: int = 4096 * 1024 * 1024
    #: Path of the runner's keepalive program in the container (:mod:`.docker_keepalive`), if it has one.
    keepalive: str | None = None
    #: Folders the container started with (``make_dirs``, mode 0777) while no command has run in it
    #: since (the first exec clears it): :meth:`make_dirs` of them is then no engine request.
    made_dirs: tuple[str, ...] = ()

    def _path(self, path: str) -> str:
        raise NotImplementedError

    async def replace_tree(self, target: str, source: str | os.PathLike[str] | None = None, mode: int = 0o755) -> None:
        """Make ``target`` exactly the local folder ``source`` (or an empty folder): what was there goes."""
        await asyncio.to_thread(replace_tree, self.container, self._path(target), source, mode)

    async def replace_trees(self, trees: Iterable[Tree]) -> None:
        """:meth:`replace_tree` for each ``(target, source, mode)`` of ``trees``, in one engine request."""
        trees = [(self._path(target), source, mode) for target, source, mode in trees]
        await asyncio.to_thread(replace_trees, self.container, trees)

    async def blank_files(self, paths: Iterable[str]) -> None:
        """Make each file of ``paths`` empty (what a compiled cache the agent wrote becomes: Python then
        compiles the source again)."""
        await asyncio.to_thread(blank_files, self.container, [self._path(p) for p in paths])

    async def make_dirs(self, paths: Iterable[str], mode: int = 0o777) -> None:
        """Create the folders ``paths`` with ``mode`` (existing ones keep their content)."""
        paths = [self._path(p) for p in paths]
        if mode == 0o777 and set(paths) <= set(self.made_dirs):
            return  # made when the container started, before anything of the task ran
        await asyncio.to_thread(make_dirs, self.container, paths, mode)

    async def stat(self, path: str) -> dict[str, Any] | None:
        """The engine's stat of ``path`` (``size``, ``mode``, ``mtime``, ``linkTarget``), ``None`` if absent."""
        return await asyncio.to_thread(stat, self.container, self._path(path))

    async def read_head(self, path: str, limit: int) -> tuple[bytes, int]:
        """The first ``limit`` bytes of a file and its size; nothing past ``limit`` is read.

        :raises SessionError: when ``path`` is not a regular file of the container.
        """
        found = await asyncio.to_thread(read_head, self.container, self._path(path), limit)
        if found is None:
            raise SessionError(f"{path!r} is not a file in container {self.container.short_id}")
        return found

    async def read_entry(self, path: str, limit: int) -> tuple[bytes, int] | str | None:
        """:meth:`read_head` in one engine request: ``None`` when ``path`` does not exist, what it is
        instead (``"a link to /etc/hostname"``, ``"a folder"``) when it is no regular file."""
        return await asyncio.to_thread(read_entry, self.container, self._path(path), limit)

    async def copy_out(
        self,
        source: str,
        save: Save,
        limit: int,
        time_limit: float | None = None,
        skip: Skip | None = None,
        watch: Watch | None = None,
    ) -> TreeCopy:
        """Stream the files under ``source`` to ``save`` (called in a worker thread), within ``limit``
        bytes and ``time_limit`` seconds; ``watch``: say what those entries are. See
        :func:`.docker_files.copy_out`."""
        path = self._path(source)
        return await asyncio.to_thread(copy_out, self.container, path, save, limit, time_limit, skip, watch)

    async def environ(self) -> list[str]:
        """The container's environment (``KEY=value``), as its commands start with it."""
        return await asyncio.to_thread(environ, self.container)

    async def changes(self) -> list[Change]:
        """The paths changed relative to the image (``docker diff``); the runner's keepalive is not one."""
        found = await asyncio.to_thread(changes, self.container)
        if self.keepalive is None:
            return found
        own = (self.keepalive, posixpath.dirname(self.keepalive))  # the program and its folder (a mount point)
        return [c for c in found if c.path not in own]

    async def processes(self) -> list[Process]:
        """The container's processes as the host lists them (none once it is frozen)."""
        return await asyncio.to_thread(processes, self.container)

    @contextlib.asynccontextmanager
    async def paused(self) -> AsyncIterator[None]:
        """Every process of the container suspended for the block (archive I/O still works): what the
        runner stages meanwhile cannot be raced. They resume after it, whatever happened."""
        try:
            await asyncio.to_thread(pause, self.container)
        except Exception as exc:  # an engine without the freezer (rootless on cgroup v1): unsuspended
            log.warning("container %s could not be paused (%s): staging goes on unpaused", self.container.short_id, exc)
            yield
            return
        try:
            yield
        finally:
            await asyncio.shield(asyncio.ensure_future(asyncio.to_thread(resume, self.container)))

    async def freeze(self) -> None:
        """End every process of the container (it stops; its files stay readable and committable)."""
        await asyncio.to_thread(freeze, self.container)

    async def snapshot(self) -> str:
        """Freeze the container and commit its file system: the provider opens this attempt's
        evaluation session from it (``evaluation: {from_snapshot: true}``). Returns the image id."""
        if self.snapshots is None or self.snapshot_key is None:
            raise SessionError(f"container {self.container.short_id} cannot be snapshotted (no provider to keep it)")
        await self.freeze()
        return await asyncio.to_thread(self.snapshots.take, self.container, self.snapshot_key, self.snapshot_limit)
