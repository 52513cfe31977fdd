"""Agent images: a task image plus one installed agent, made once and reused by every attempt.

A session whose params carry an ``agent_install`` recipe (see
:class:`~pytest_agentcompass.vocabulary.agent_install.AgentInstall`) starts from
``agentcompass-agent:<digest of the task image's id and the recipe>``. The
first session that needs it makes it:

1. an install container from the task image, offline (``network_mode none``), as root,
   with the cached files mounted read-only at ``/opt/agentcompass/pkgs`` (copied in
   instead when the engine is not on this machine), runs the recipe's script;
2. that container is committed to a temporary image, and the derived image is built
   ``FROM`` the task image with only the agent's folder copied over (``COPY --from``):
   the task image's own config (command, user, env, workdir) is untouched, and the
   packages and the install's labels stay out of it;
3. the container and the temporary image are removed, whatever happened.

Within one process an install runs once per image (later sessions wait for
it; a failure is kept for the rest of the run, so retries do not repeat it);
processes take turns through a lock file, so the second finds the image made.
Derived images are kept across runs, like task images: the tag changes when
the task image or the recipe does. ``docker image ls --filter label=agentcompass.agent``
lists them.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..concurrency.flock import file_lock
from ..vocabulary.agent_install import PKGS_DIR, AgentInstall
from ..vocabulary.artifacts import save_artifact
from ..vocabulary.errors import SessionError
from .base import SessionConfig
from .docker_bases import has_image
from .docker_build import BuildJob, BuildSpec
from .docker_files import put_tree

__all__ = ["REPOSITORY", "AgentImages", "derived_tag", "with_agent"]

#: Image repository of every derived image (the tag is a digest).
REPOSITORY = "agentcompass-agent"
#: Log lines quoted in the error of a failed install.
_TAIL_LINES = 30
#: Bytes of install output kept (the log artifact).
_LOG_LIMIT = 1 << 20


def derived_tag(base_id: str, install: AgentInstall) -> str:
    digest = hashlib.sha256(f"{base_id}\n{install.key}".encode()).hexdigest()[:24]
    return f"{REPOSITORY}:{digest}"


def _tail(log: str) -> str:
    return "\n".join(log.rstrip().splitlines()[-_TAIL_LINES:])


class _InstallJob:
    """One install, blocking (run in a worker thread); :meth:`abort` stops it from another thread."""

    def __init__(
        self, client: Any, base_id: str, install: AgentInstall, tag: str, labels: Mapping[str, str], local: bool
    ) -> None:
        self.client = client
        self.base_id = base_id
        self.install = install
        self.tag = tag
        self.labels = {
            **labels,
            "agentcompass": "1",
            "agentcompass.purpose": "agent-install",
            "agentcompass.install-key": install.key,
        }
        self.local = local
        self.log = ""
        self.error: str | None = None
        self.timed_out = False
        self._container = ""
        self._build: BuildJob | None = None
        self._lock = threading.Lock()
        self._aborted = False

    def abort(self) -> None:
        with self._lock:
            self._aborted = True
            container, build = self._container, self._build
        if build is not None:
            build.abort()
        if container:
            with contextlib.suppress(Exception):
                self.client.api.remove_container(container, force=True)

    def run(self) -> None:
        api, install = self.client.api, self.install
        temporary = ""
        try:
            self._remove_leftovers()
            binds = {install.files: {"bind": PKGS_DIR, "mode": "ro"}} if self.local else None
            created = api.create_container(
                self.base_id,
                command=["sh", "-c", install.wrapper()],
                entrypoint=[],
                user="0:0",
                working_dir="/",
                labels=self.labels,
                name=f"agentcompass-install-{secrets.token_hex(6)}",
                host_config=api.create_host_config(network_mode="none", binds=binds),
            )
            with self._lock:
                self._container = created["Id"]
                if self._aborted:
                    return
            if not self.local:  # an engine elsewhere cannot see this machine's folders: send the files
                put_tree(self.client.containers.prepare_model({"Id": created["Id"]}), install.files, PKGS_DIR)
            api.start(created["Id"])
            try:
                code = int(api.wait(created["Id"], timeout=install.timeout).get("StatusCode", -1))
            except Exception:  # the client's read timeout (requests), or the container was removed by abort
                if self._aborted:
                    return
                self.timed_out, code = True, -1
                with contextlib.suppress(Exception):
                    api.kill(created["Id"])
            self.log = api.logs(created["Id"], stdout=True, stderr=True)[-_LOG_LIMIT:].decode("utf-8", "replace")
            if self.timed_out:
                self.error = f"timed out after {install.timeout:g}s"
                return
            if code != 0:
                self.error = f"the install script exited with {code}"
                return
            if self._aborted:
                return
            temporary = str(api.commit(created["Id"])["Id"])
            self._derive(temporary)
        except Exception as exc:
            if not self._aborted:
                self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self._cleanup(temporary)

    def _derive(self, temporary: str) -> None:
        """Build the derived image: the task image plus the agent's folder from ``temporary``."""
        install = self.install
        labels = {
            "agentcompass": "1",
            "agentcompass.agent": install.agent,
            "agentcompass.agent-version": install.version,
            "agentcompass.base-image": self.base_id,
            "agentcompass.install-key": install.key,
        }
        context = tempfile.mkdtemp(prefix="agentcompass-derive-")
        try:
            Path(context, "Dockerfile").write_text(
                f"FROM {self.base_id}\n"
                f"COPY --from={temporary} {install.prefix} {install.prefix}\n"
                + "".join(f'LABEL "{k}"="{v}"\n' for k, v in labels.items())
            )
            build = BuildJob(self.client, BuildSpec(context), self.tag, None)
            with self._lock:
                self._build = build
                if self._aborted:
                    return
            build.run()
            if build.error is not None and not self._aborted:
                self.error = f"making the image failed: {build.error}\n{build.tail()}"
        finally:
            shutil.rmtree(context, ignore_errors=True)

    def _cleanup(self, temporary: str) -> None:
        api = self.client.api
        if self._container:
            with contextlib.suppress(Exception):
                api.remove_container(self._container, force=True, v=True)
        if temporary:
            with contextlib.suppress(Exception):
                api.remove_image(temporary, force=True)

    def _remove_leftovers(self) -> None:
        """What an install of the same key left when its process was killed (we hold its lock now)."""
        api = self.client.api
        selector = {"label": ["agentcompass.purpose=agent-install", f"agentcompass.install-key={self.install.key}"]}
        for container in api.containers(all=True, filters=selector):
            with contextlib.suppress(Exception):
                api.remove_container(container["Id"], force=True, v=True)
        for image in api.images(filters=selector, quiet=True):
            with contextlib.suppress(Exception):
                api.remove_image(image, force=True)


class AgentImages:
    """The derived images of one engine, made by this process."""

    def __init__(self, engine: str = "") -> None:
        #: The engine (one of a pool): its lock files are its own.
        self.engine = engine
        #: Images known to be on the engine; failed installs per run (retries get the same error).
        self._present: set[str] = set()
        self._failed: dict[tuple[str, str], SessionError] = {}
        #: Base image ids by (run, name): an image does not change under its name within a run.
        self._ids: dict[tuple[str, str], str] = {}
        # Futures belong to one event loop; an xdist worker runs each task in a loop of its own.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._jobs: dict[str, asyncio.Future[dict[str, Any]]] = {}

    async def ensure(
        self, client: Any, base: str, install: AgentInstall, labels: Mapping[str, str], local: bool, run: str
    ) -> dict[str, Any]:
        """The derived image of ``base`` (made now unless the engine has it) and what it took.

        :returns: ``{"agent", "version", "image", "base", "installed"}``, plus ``seconds`` and
            ``log`` (the artifact) when this call made it.
        :raises SessionError: when the install fails or times out, with the log tail.
        """
        base_id = self._ids.get((run, base))
        if base_id is None:
            base_id = self._ids[(run, base)] = str((await asyncio.to_thread(client.images.get, base)).id)
        tag = derived_tag(base_id, install)
        facts: dict[str, Any] = {
            "agent": install.agent,
            "version": install.version,
            "image": tag,
            "base": base,
            "installed": False,
        }
        if tag in self._present:
            return facts
        failed = self._failed.get((tag, run))
        if failed is not None:
            raise SessionError(str(failed))
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop, self._jobs = loop, {}
        job = self._jobs.get(tag)
        mine = job is None
        if job is None:
            install_job = _InstallJob(client, base_id, install, tag, labels, local)
            job = self._jobs[tag] = asyncio.ensure_future(self._install_once(install_job, run, facts))
        # Shielded: one cancelled waiter must not cancel the install others wait for.
        done = await asyncio.shield(job)
        return done if mine else {**done, "installed": False, "seconds": None, "log": None}

    async def _install_once(self, job: _InstallJob, run: str, facts: dict[str, Any]) -> dict[str, Any]:
        try:
            done = await self._install(job, facts)
            self._present.add(job.tag)
            return done
        except SessionError as exc:
            self._failed[(job.tag, run)] = exc
            raise
        finally:
            self._jobs.pop(job.tag, None)

    async def _install(self, job: _InstallJob, facts: dict[str, Any]) -> dict[str, Any]:
        client, tag, install = job.client, job.tag, job.install
        if await asyncio.to_thread(has_image, client, tag):
            return facts  # made by an earlier run
        name = tag.replace(":", "-")
        if self.engine:
            name += "-" + hashlib.sha256(self.engine.encode()).hexdigest()[:8]
        async with file_lock(Path(tempfile.gettempdir()) / f"{name}.lock"):
            if await asyncio.to_thread(has_image, client, tag):
                return facts  # another process made it meanwhile
            started = time.monotonic()
            worker = asyncio.ensure_future(asyncio.to_thread(job.run))
            try:
                await asyncio.shield(worker)
            except asyncio.CancelledError:
                await asyncio.shield(asyncio.to_thread(job.abort))
                await asyncio.shield(worker)
                raise
            seconds = round(time.monotonic() - started, 3)
        log = save_artifact(f"agent-install/{install.agent}-{install.version}.log", job.log)
        if job.error is not None:
            where = f" (log: {log})" if log else ""
            raise SessionError(
                f"installing {install.agent} {install.version} into image {facts['base']} failed: "
                f"{job.error}{where}\n{_tail(job.log)}"
            )
        return {**facts, "installed": True, "seconds": seconds, "log": log}


_shared: dict[tuple[str, int], AgentImages] = {}


async def with_agent(
    client: Any, image: str, config: SessionConfig, engine: str, local: bool, run: str, comebacks: int = 0
) -> tuple[str, dict[str, Any] | None]:
    """The image a task session of ``config`` starts from, and what its agent install took.

    ``image`` itself (and ``None``) unless the params carry an ``agent_install``
    recipe; an evaluation session never needs the agent. What is known of ``engine``
    starts anew once it came back from an outage (``comebacks``): it may be a fresh engine.
    """
    recipe = config.params.get("agent_install")
    if not recipe or config.purpose != "task":
        return image, None
    images = _shared.get((engine, comebacks))
    if images is None:
        images = _shared[engine, comebacks] = AgentImages(engine)
    facts = await images.ensure(client, image, AgentInstall.from_params(recipe), config.labels, local, run)
    return str(facts["image"]), facts
