"""A session of the ``docker`` provider: one running container, reached through the Docker SDK.

Commands run through ``docker exec`` under the container's init, each with a
token that finds everything it started (:mod:`.docker_exec`); files move as
tar archives (:mod:`.docker_files`); the network policy attaches and
detaches the bridge network; the trusted access of :mod:`.docker_trusted`
(what a verifier's runner may call without running the agent's tools) is
mixed in. The provider that opens these is :mod:`.docker`.
"""

from __future__ import annotations

import asyncio
import io
import logging
import os
import secrets
import tarfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any

from ..vocabulary.errors import SessionError
from ..vocabulary.types import ExecResult, NetworkPolicy
from .base import EnvironmentSession, argv_list
from .capture import StreamCapture
from .docker_engine import docker_sdk
from .docker_exec import DRAIN_GRACE, INIT, ExecStream, exec_output, kill_exec
from .docker_files import get_tree, put_tree, read_head
from .docker_state import why_stopped
from .docker_trusted import TrustedAccess
from .markers import EXEC_MARKER

__all__ = ["BRIDGE", "DockerSession", "remove_container"]

BRIDGE = "bridge"
log = logging.getLogger("pytest_agentcompass")


class DockerSession(TrustedAccess, EnvironmentSession):
    """A running container. Relative paths are relative to the workdir."""

    def __init__(
        self,
        client: Any,
        container: Any,
        workdir: str,
        policy: NetworkPolicy,
        output_limit: int,
        local: bool = True,
    ) -> None:
        self.client = client
        #: Whether the engine shares this kernel, so host-side process kills reach the container.
        self.local = local
        self.container = container
        self.workdir = workdir
        self.network_policy = policy
        self.output_limit = output_limit
        #: The agent image it started from and whether this open installed it (see :mod:`.docker_derived`).
        self.agent_install: dict[str, Any] | None = None
        #: Host pids of the container's init and keepalive, recorded as it started (``record_pids``): the runner's own.
        self.runner_pids: frozenset[int] = frozenset()
        #: Created with ``network_mode none`` and not attached since (the bridge must wait for it to go).
        self._on_none = policy == "disabled"
        self._closed = False
        self._removal: asyncio.Future[None] | None = None

    def _path(self, path: str) -> str:
        pure = PurePosixPath(path)
        return str(pure if pure.is_absolute() else PurePosixPath(self.workdir) / pure)

    async def exec(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: str | None = None,
    ) -> ExecResult:
        """See :meth:`EnvironmentSession.exec`; ``user`` runs it as that user (the image's by default).

        On timeout or cancel, every process the command started is killed
        (see :func:`.docker_exec.kill_exec`), and the call returns (or raises)
        within ``KILL_PATIENCE`` plus ``DRAIN_GRACE`` whatever it left.
        """
        api = self.client.api
        self.made_dirs = ()  # a command may remove them: made again when asked for from now on
        # The exec's init carries the token, so a kill can find it (and its tree) inside the container.
        token = secrets.token_hex(16)
        options = {
            "environment": {**(env or {}), EXEC_MARKER: token},
            "workdir": self._path(cwd) if cwd else self.workdir,
            "user": user or "",
        }
        exec_id = ""
        started = time.monotonic()
        streams = {"out": StreamCapture(self.output_limit), "err": StreamCapture(self.output_limit)}

        def start() -> ExecStream:
            nonlocal exec_id
            exec_id = api.exec_create(self.container.id, [*INIT, *argv_list(argv)], **options)["Id"]
            return exec_output(api, exec_id)

        def pump(stream: ExecStream) -> dict[str, Any]:
            """Read the output to its end (every writer gone), then the exit code."""
            try:
                for out, err in stream:
                    for key, chunk in (("out", out), ("err", err)):
                        if chunk:
                            streams[key].add(chunk)
            except Exception:
                if not stream.aborted:
                    raise
            # Cut short by the kill: its exit code is not wanted (and the engine may be what hangs).
            return {} if stream.aborted else dict(api.exec_inspect(exec_id))

        # One worker-thread call creates and starts the exec, one reads it to
        # the end. The start is a task of its own, so a cancel landing while
        # it is in flight still learns that the exec started, and kills it.
        starting = asyncio.ensure_future(asyncio.to_thread(start))
        reader: asyncio.Future[dict[str, Any]] | None = None
        timed_out = False
        try:
            try:
                stream = await asyncio.shield(starting)
            except Exception as exc:
                if "is not running" not in str(exc):
                    raise
                # The engine's 409 names no cause: how the container ended (killed, out of memory) does.
                raise SessionError(await asyncio.to_thread(why_stopped, self.container)) from exc
            reader = asyncio.ensure_future(asyncio.to_thread(pump, stream))
            try:
                await asyncio.wait_for(asyncio.shield(reader), timeout)
            except TimeoutError:
                timed_out = True
        finally:
            if reader is None or not reader.done():  # timed out or cancelled: kill the exec's processes
                # Shielded: a second cancel must not leave the processes running.
                stop = self._stop(lambda: exec_id, token, user or "", starting, reader, pump)
                await asyncio.shield(asyncio.ensure_future(stop))
        assert reader is not None
        code = (await reader).get("ExitCode")
        out, err = streams["out"], streams["err"]
        stdout, stderr = out.text(), err.text()
        return ExecResult(
            exit_code=-9 if timed_out or code is None else int(code),
            stdout=stdout,
            stderr=stderr,
            timed_out=timed_out,
            stdout_truncated=out.cut,
            stderr_truncated=err.cut,
            duration=time.monotonic() - started,
            stdout_omitted=out.omitted,
            stderr_omitted=err.omitted,
        )

    async def _stop(
        self,
        exec_id: Callable[[], str],
        token: str,
        user: str,
        starting: asyncio.Future[ExecStream],
        reader: asyncio.Future[dict[str, Any]] | None,
        pump: Callable[[ExecStream], dict[str, Any]],
    ) -> None:
        try:
            stream = await starting
        except Exception:
            return  # never started
        killed = await asyncio.to_thread(
            kill_exec, self.client.api, self.container.id, exec_id(), token, user, self.local
        )
        if not killed:
            log.warning("%s: exec %s: some of its processes could not be killed", self.describe(), exec_id()[:12])
        # Every writer is dead: the stream ends now (read it to the end, also when nobody did yet).
        reading = reader if reader is not None else asyncio.ensure_future(asyncio.to_thread(pump, stream))
        try:
            await asyncio.wait_for(asyncio.shield(reading), DRAIN_GRACE)
        except TimeoutError:
            # A writer lives on (it could not be killed) or the engine holds the stream: stop reading it.
            log.warning(
                "%s: exec %s: output still open after the kill; stopped reading", self.describe(), exec_id()[:12]
            )
            stream.abort()
            await reading

    async def read_bytes(self, path: str) -> bytes:
        target = self._path(path)

        def fetch() -> bytes:
            try:
                found = read_head(self.container, target, 1 << 62)  # streamed: one copy of the file, no more
            except Exception as exc:
                raise SessionError(f"cannot read {path!r} in container {self.container.short_id}: {exc}") from None
            if found is None:
                raise SessionError(f"{path!r} in container {self.container.short_id} is not a file")
            return found[0]

        return await asyncio.to_thread(fetch)

    async def write_bytes(self, path: str, data: bytes) -> None:
        target = PurePosixPath(self._path(path))

        def put() -> None:
            payload = io.BytesIO()
            with tarfile.open(fileobj=payload, mode="w") as archive:
                for parent in reversed(target.parents[:-1]):
                    entry = tarfile.TarInfo(str(parent).lstrip("/"))
                    entry.type, entry.mode = tarfile.DIRTYPE, 0o755
                    archive.addfile(entry)
                entry = tarfile.TarInfo(str(target).lstrip("/"))
                entry.size, entry.mode = len(data), 0o644
                archive.addfile(entry, io.BytesIO(data))
            self.container.put_archive("/", payload.getvalue())

        await asyncio.to_thread(put)

    async def put_tree(self, source: str | os.PathLike[str], target: str) -> None:
        """Copy the local folder ``source`` to ``target`` in one archive, modes kept, owned by root."""
        await asyncio.to_thread(put_tree, self.container, source, self._path(target))

    async def get_tree(self, source: str, limit: int) -> tuple[dict[str, bytes], bool]:
        """The regular files under ``source`` (relative names), at most ``limit`` bytes in all,
        and whether some were left out for the limit. A missing ``source`` gives no files."""
        return await asyncio.to_thread(get_tree, self.container, self._path(source), limit)

    async def set_network_policy(self, policy: NetworkPolicy) -> None:
        if policy == self.network_policy:
            return
        await asyncio.to_thread(self._switch_network, policy)
        self.network_policy = policy

    def _switch_network(self, policy: NetworkPolicy) -> None:
        api, container = self.client.api, self.container.id
        if policy == "disabled":
            api.disconnect_container_from_network(container, BRIDGE, force=True)
            return
        if self._on_none:  # "none" admits no other network: leave it once, then the bridge can join
            api.disconnect_container_from_network(container, "none")
            self._on_none = False
        api.connect_container_to_network(container, BRIDGE)

    # -- the model gateway's network (beside the policy's) ------------------------------
    def join_network(self, network: str) -> None:
        """Attach the container to ``network`` too, whatever the policy (the model gateway's route)."""
        api, container = self.client.api, self.container.id
        if self._on_none:  # "none" admits no other network
            api.disconnect_container_from_network(container, "none")
            self._on_none = False
        api.connect_container_to_network(container, network)

    def leave_network(self, network: str) -> None:
        """Detach the container from ``network`` (the policy's own attachment stays)."""
        self.client.api.disconnect_container_from_network(self.container.id, network, force=True)

    async def close(self) -> None:
        self._closed = True
        if self._removal is None:
            self._removal = asyncio.ensure_future(asyncio.to_thread(remove_container, self.container))
        # Shielded so a cancelled close still removes the container; a second close waits for it.
        await asyncio.shield(self._removal)

    def describe(self) -> str:
        return f"container {self.container.short_id} ({self.container.name})"


def remove_container(container: Any) -> None:
    docker = docker_sdk()
    try:
        container.remove(force=True, v=True)
    except docker.errors.NotFound:
        pass
