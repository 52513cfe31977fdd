"""The ``docker`` provider: one container per session, through the Docker SDK.

Install with ``pip install 'pytest-agentcompass[docker]'``. The SDK is
blocking, so every call runs in a worker thread; every container carries the
labels of its run, request, task and attempt, and ``agentcompass=1``, so a
leak can always be found with ``docker ps -a --filter label=agentcompass``.

Params: ``image``, ``workdir`` (default ``/work``; ``null`` for the image's
WORKDIR), ``mem_limit``, ``nano_cpus``, ``output_limit`` (bytes kept per
stream), ``pull`` (pull a missing image instead of failing preflight),
``max_parallel_builds``. A benchmark may give each task its own image, or a
build context (built by :mod:`.docker_images`), and limits (``cpus``,
``memory_mb``) through ``ExecutionPlan.environment``; what the config sets wins.

Network policies ``full`` (the default bridge network) and ``disabled`` (no
network) are supported. A container starts with its plan's baseline policy:
on the bridge for ``full``, with no network at all (``network_mode none``,
faster to start and remove) for ``disabled``; a later phase that needs the
network attaches the bridge, and one that does not detaches it again. A
third attachment, independent of the policy, is the model gateway's internal
network (:mod:`.docker_network`), joined for the run phase of a harness that
asks for the gateway: with ``disabled`` it is the only way out.

This module opens containers (on an engine the pool places them on) and
ends what an attempt kept; a session, the container once open, is
:mod:`.docker_session`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..vocabulary.errors import SessionError
from ..vocabulary.types import NetworkPolicy
from .base import BaseEnvironment, EnvironmentSession, HostRoute, SessionConfig
from .docker_derived import with_agent
from .docker_engine import Engine, docker_sdk, engine_list
from .docker_images import choose_image
from .docker_keepalive import KeepaliveVolumes, arch_of, install, keepalive_path, program, sweep_volumes, volume_mount
from .docker_network import GatewayNetworks, sweep_gateway
from .docker_params import DockerParams, limits, session_params, storage_refused
from .docker_pool import EnginePool
from .docker_session import BRIDGE, DockerSession, remove_container
from .docker_state import Snapshots, runner_processes, sweep_snapshots
from .markers import PROCESS_LABEL, this_process
from .process import DEFAULT_OUTPUT_LIMIT

if TYPE_CHECKING:
    from ..config import EnvironmentSpec

__all__ = ["DockerEnvironment", "DockerParams", "DockerSession"]

#: What keeps a container up on an engine of an architecture :mod:`.docker_keepalive` has no program
#: for (anything but amd64 and arm64): the image's own ``sleep``, by absolute path (through ``PATH``
#: one the agent put earlier on it would run). Elsewhere the runner's own program does (see there).
#: Either way its pid is what a benchmark that asks (``record_pids``) knows it by
#: (:func:`.docker_state.runner_processes`); nothing identifies it by its command line.
_IMAGE_KEEPALIVE = ["/bin/sleep", "2147483647"]
log = logging.getLogger("pytest_agentcompass")


def _create(
    client: Any,
    image: str,
    options: dict[str, Any],
    host: dict[str, Any],
    keepalive: bytes | None,
    dirs: Sequence[str] = (),
    record_pids: bool = False,
) -> tuple[Any, frozenset[int], tuple[str, ...]]:
    """Create and start a container; returns it, the pids of the runner's own processes in it (with
    ``record_pids``: :func:`.docker_state.runner_processes`, one more request) and the folders of
    ``dirs`` it made. A container that does not get that far is removed again.

    ``keepalive``: the runner's program that the command runs, to write to its path first (``None``:
    the command's program is there already, from the engine's keepalive volume, or is the image's
    ``sleep``); ``dirs``: folders written in the same request. Should the image refuse them (its
    ``/logs`` a file, say), the keepalive goes alone and the folders are left to whoever asks for
    them later, as without ``make_dirs``. All of it is one worker-thread call, so that a cancel can
    land only before the create or after the container is known to the caller (see :func:`_start`)."""
    api = client.api
    created = api.create_container(image, host_config=api.create_host_config(**host), **options)
    # The model without the inspect ``containers.create`` would make: the id and name are all it needs.
    container = client.containers.prepare_model({"Id": created["Id"], "Name": "/" + options["name"]})
    made: tuple[str, ...] = ()
    try:
        own = None if keepalive is None else (options["command"][0], keepalive)
        if own is not None or dirs:  # written before the start (the archive API works on a created container)
            try:
                install(api, created["Id"], own, dirs)
                made = tuple(dirs)
            except Exception as exc:
                if not dirs or "Error processing tar file" not in str(exc):
                    raise
                if own is not None:
                    install(api, created["Id"], own)
        api.start(created["Id"])
        return container, runner_processes(container) if record_pids else frozenset(), made
    except BaseException:
        remove_container(container)
        raise


async def _start(
    client: Any,
    image: str,
    options: dict[str, Any],
    host: dict[str, Any],
    keepalive: bytes | None,
    dirs: Sequence[str],
    record_pids: bool,
) -> tuple[Any, frozenset[int], tuple[str, ...]]:
    """Create and start a container in one worker-thread call; shielded, so a cancel meanwhile
    still learns of the container and removes it."""
    args = (client, image, options, host, keepalive, dirs, record_pids)
    starting = asyncio.ensure_future(asyncio.to_thread(_create, *args))
    try:
        return await asyncio.shield(starting)
    except BaseException:
        await asyncio.shield(asyncio.ensure_future(_discard(starting)))
        raise


async def _discard(starting: asyncio.Future[tuple[Any, frozenset[int], tuple[str, ...]]]) -> None:
    """Remove the container ``starting`` gives, once it gives one (its open was cancelled or failed)."""
    try:
        container, _, _ = await starting
    except BaseException:
        return  # nothing was created, or _create removed it
    await asyncio.to_thread(remove_container, container)


def _sweep_state(client: Any, run_id: str, process: str | None = None) -> int:
    """Remove what run ``run_id`` (with ``process``: what that process of it) left on an engine
    besides containers: its snapshot images (counted: each is an environment's state) and its
    keepalive volumes (the runner's own: not counted)."""
    sweep_volumes(client, run_id, process)
    return sweep_snapshots(client, run_id, process)


def _absolute_dirs(value: Any) -> list[str]:
    """``make_dirs`` of a session's params (a benchmark's ``plan.environment``): absolute folders the
    container starts with, mode 0777, made in one request before it starts."""
    if value is None:
        return []
    if not isinstance(value, list | tuple) or not all(
        isinstance(d, str) and d.startswith("/") and d.strip("/") for d in value
    ):
        raise SessionError(f"make_dirs must be a list of absolute folders (not /), not {value!r}")
    return list(value)


class DockerEnvironment(BaseEnvironment):
    """Opens one container per session from ``params.image``."""

    id = "docker"
    params_model = DockerParams
    supported_network_policies = frozenset({"full", "disabled"})
    dynamic_network_policy = True

    def __init__(self, spec: EnvironmentSpec, rootdir: Path | None = None) -> None:
        super().__init__(spec, rootdir)
        #: WORKDIR of the images this provider started (an image does not change under its tag in a run).
        self._workdirs: dict[str, str] = {}
        #: The run and request labels of this provider's sessions (for the networks it makes).
        self._labels: dict[str, str] = {}
        self._gateway_networks = GatewayNetworks(self.spec.params.get("gateway_firewall") or "auto", self.notes)
        #: Snapshots of task containers that this attempt's evaluation session starts from.
        self.snapshots = Snapshots()
        #: Engines whose storage driver refused a disk quota, and what they said.
        self._no_storage: dict[str, str] = {}
        #: Each engine's architecture, if the runner has a keepalive program for it (see :mod:`.docker_keepalive`).
        self._arches: dict[str, str | None] = {}
        #: The volume on each engine the keepalive runs from.
        self._keepalives = KeepaliveVolumes()

    @property
    def pool(self) -> EnginePool:
        """The engines sessions go to (one, the environment's, without ``params.engines``)."""
        if getattr(self, "_pool", None) is None:
            params = self.spec.params
            self._pool = EnginePool(engine_list(params.get("engines")), float(params.get("probe_interval") or 5.0))
            self._pool.notes = self.notes  # an engine left out at preflight: in the request's summary
        return self._pool

    async def preflight(self) -> None:
        docker_sdk()
        await self.pool.preflight(self.spec.params.get("image"), bool(self.spec.params.get("pull")))

    async def open(self, config: SessionConfig) -> EnvironmentSession:
        return await self.pool.open(config, self._open_on)

    async def _open_on(self, engine: Engine, config: SessionConfig) -> EnvironmentSession:
        """Open one container on ``engine`` (placement picked it)."""
        params = session_params(config.params, config.purpose)
        client = await asyncio.to_thread(engine.client)
        key = (config.task_id, config.attempt_index)
        installed: Any = None
        if params.get("from_snapshot"):  # the task's container, frozen at the end of its run (see snapshot())
            image = self.snapshots.image(key)
            if image is None:
                raise SessionError(
                    f"task {config.task_id!r} attempt {config.attempt_index}: the evaluation starts from a snapshot "
                    "of the task's container, but none was taken (the benchmark calls env.snapshot() before the "
                    "task environment closes)"
                )
        else:
            pooled = engine.name if self.pool.pooled else ""
            image = await choose_image(client, params, self.run_files, engine=pooled, comebacks=engine.comebacks)
            # An agent CLI's harness asked for its install: the image with it (made once).
            image, installed = await with_agent(
                client, image, config, pooled, engine.local, str(self.run_dir), engine.comebacks
            )
        # Not into a snapshot: its files are the agent's (a /logs it broke fails the verifier, not the open).
        dirs = [] if params.get("from_snapshot") else _absolute_dirs(params.get("make_dirs"))
        workdir = params.get("workdir", "/work")
        from_image = workdir is None
        if from_image:  # the image's own WORKDIR (published task verifiers rely on it): it exists
            workdir = self._workdirs.get(image)
            if workdir is None:
                attrs = (await asyncio.to_thread(client.images.get, image)).attrs
                workdir = self._workdirs[image] = (attrs.get("Config") or {}).get("WorkingDir") or "/"
        workdir = str(workdir)
        # Started with the baseline policy: with no network at all when that is "disabled"
        # (a later phase that needs the network attaches the bridge then).
        isolated = config.network_policy == "disabled"
        self._labels = {k: v for k, v in config.labels.items() if k in ("agentcompass.run", "agentcompass.request")}
        # Named here, so nothing has to be read back from the engine after the create.
        name = f"agentcompass-{secrets.token_hex(6)}"
        host: dict[str, Any] = {"init": True, "network_mode": "none" if isolated else BRIDGE}  # init reaps orphans
        if isolated:  # the engine writes no /etc/hosts line for the hostname without a network
            host["extra_hosts"] = {name: "127.0.0.1"}
        host.update(limits(params))
        if "storage_opt" in host and engine.name in self._no_storage:
            self._without_storage(host, params, engine)
        keepalive, code = await self._keepalive(engine, client, image, host, config)
        options: dict[str, Any] = {
            "command": [keepalive] if keepalive else _IMAGE_KEEPALIVE,
            "entrypoint": [],  # an image's ENTRYPOINT would wrap the keepalive
            "working_dir": workdir,  # the engine creates it
            "hostname": name,
            "labels": {"agentcompass": "1", **config.labels, PROCESS_LABEL: this_process()},  # see sweep_own
            "name": name,
            "detach": True,
        }
        record_pids = bool(params.get("record_pids"))
        try:
            container, pids, made = await _start(client, image, options, host, code, dirs, record_pids)
        except Exception as exc:
            if "storage_opt" not in host or not storage_refused(exc):
                raise
            self._no_storage[engine.name] = str(getattr(exc, "explanation", None) or exc).strip()
            self._without_storage(host, params, engine)
            container, pids, made = await _start(client, image, options, host, code, dirs, record_pids)
        policy: NetworkPolicy = "disabled" if isolated else "full"
        output_limit = int(params.get("output_limit", DEFAULT_OUTPUT_LIMIT))
        session = DockerSession(client, container, workdir, policy, output_limit, local=engine.local)
        session.agent_install = installed
        session.made_dirs = made
        session.runner_pids = pids  # no await from the start to the return: a cancel cannot orphan the container
        session.keepalive = keepalive
        session.snapshots, session.snapshot_key = self.snapshots, key
        session.snapshot_limit = int(params.get("snapshot_limit_mb") or 4096) * 1024 * 1024
        return session

    async def _keepalive(
        self, engine: Engine, client: Any, image: str, host: dict[str, Any], config: SessionConfig
    ) -> tuple[str | None, bytes | None]:
        """The runner's own keepalive for a new container: its path (in a folder with a random name:
        nothing the agent planted is there) and the program to write there before the start, or
        ``None`` when it runs from the engine's volume (mounted read-only there: the mount is added to
        ``host``). ``(None, None)`` on an engine of an architecture with no program: the image's sleep.
        A container the run keeps (``config.kept``) gets its own copy: the volume goes with the provider."""
        if engine.name not in self._arches:
            self._arches[engine.name] = await asyncio.to_thread(arch_of, client)
        arch = self._arches[engine.name]
        if arch is None:
            return None, None
        keepalive = keepalive_path()
        # Labelled as the provider's sessions are, but for the task and attempt (a leak is found like theirs).
        labels = {k: v for k, v in config.labels.items() if k not in ("agentcompass.task", "agentcompass.attempt")}
        labels[PROCESS_LABEL] = this_process()
        volume = None if config.kept else await self._keepalives.volume(engine.incarnation, client, image, arch, labels)
        if volume is None:
            return keepalive, program(arch)
        host["mounts"] = [volume_mount(keepalive, volume)]
        return keepalive, None

    def _without_storage(self, host: dict[str, Any], params: Mapping[str, Any], engine: Engine) -> None:
        """The engine cannot cap a container's disk: refuse (``storage_limits: require``) or say so once."""
        reason = self._no_storage[engine.name]
        where = engine.url if self.pool.pooled else "this Docker engine"
        if params.get("storage_limits") == "require":
            raise SessionError(
                f"the task asks for a disk quota (storage_mb={params.get('storage_mb')}), which {where} cannot "
                f"apply (storage_limits: require): {reason}"
            )
        host.pop("storage_opt", None)
        note = (
            f"storage_mb (a task's disk quota) is not applied on {where}: its storage driver cannot cap a "
            f"container's disk ({reason}); tasks run without it. Docker applies it on overlay2 over xfs with "
            "project quotas, btrfs, zfs or devicemapper; storage_limits: require makes such tasks errors instead"
        )
        if note not in self.notes:
            self.notes.append(note)
            log.warning("%s", note)

    async def end_attempt(self, task_id: str, attempt_index: int) -> None:
        """The attempt is over: its snapshot (if its evaluation started from one) is removed."""
        await asyncio.to_thread(self.snapshots.release, (task_id, attempt_index))

    async def host_route(self, session: EnvironmentSession) -> HostRoute:
        """The container joins the request's internal gateway network (made on first use) for the run phase."""
        engine = getattr(session, "engine", None) or self.pool.engines[0]  # a pooled session knows its engine
        return await self._gateway_networks.route(getattr(session, "inner", session), engine, self._labels)

    async def sweep(self, run_id: str) -> int:
        # Containers first: a network or volume in use cannot go.
        removed = await self.pool.sweep(run_id, also=_sweep_state)
        return removed + await sweep_gateway(self.pool.engines, run_id)

    async def sweep_own(self, run_id: str) -> int:
        # This process's containers, snapshots and keepalive volumes; then its gateway networks and
        # their firewall rules (this provider made them all): a close after a grace that ran out is
        # cut short or never runs. The run's other gateway networks belong to the other workers.
        process = this_process()
        also = functools.partial(_sweep_state, process=process)
        removed = await self.pool.sweep(run_id, also=also, process=process)
        await self._gateway_networks.close()
        return removed

    async def aclose(self) -> None:
        await self._gateway_networks.close()  # after the request's gateway stopped listening on them
        await asyncio.to_thread(self.snapshots.release_all)
        pool = getattr(self, "_pool", None)
        if pool is not None:
            await pool.remove_orphans()  # containers an engine owed: they used the keepalive volume
        await self._keepalives.aclose()
        if pool is not None:
            await pool.aclose()
