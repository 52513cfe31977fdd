"""A pool of Docker engines behind the ``docker`` provider: placement, health and images.

Without ``params.engines`` the pool holds one engine, the one the environment
names (``DOCKER_HOST``), and sessions are opened on it directly, as always.
With it, each session goes to the least-loaded engine that answers and has a
free slot (fewest sessions per slot of ``capacity``; an engine without a
capacity counts as one slot); a ``fresh`` evaluation asks for its task's
engine through ``SessionConfig.placement``.

Faults: an engine that does not answer at preflight is left out with a note
(the run fails only when none answers); one that stops answering mid-run
fails the calls in flight as :class:`~pytest_agentcompass.vocabulary.errors.SessionError`
(an environment error, retried elsewhere when ``max_retries`` allows) and gets
no new session until a probe, at most every ``probe_interval`` seconds, finds
it answering again. Containers it could not remove meanwhile are removed then.

Nothing here is process-local: per-engine capacity goes through
:func:`~pytest_agentcompass.concurrency.limits.capacity_for`, which is run-wide under
pytest-xdist, and an image an engine lacks is copied from one that has it
(``docker save`` / ``load`` through the SDK), once per engine and image.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from ..vocabulary.errors import EnvironmentLost, PreflightError, SessionError
from .base import EnvironmentSession, SessionConfig
from .docker_bases import from_lines, local_base
from .docker_build import BuildSpec
from .docker_engine import Engine, EngineParams, copy_image, has_image, reason, remove_container
from .docker_params import session_params
from .docker_pooled import PooledSession
from .markers import run_filter

__all__ = ["EnginePool", "Opener", "PooledSession"]

log = logging.getLogger("pytest_agentcompass")

Opener = Callable[[Engine, SessionConfig], Awaitable[EnvironmentSession]]


class EnginePool:
    """The engines of one provider and where its sessions go."""

    def __init__(self, specs: Sequence[EngineParams] | None, probe_interval: float = 5.0) -> None:
        self.engines = [Engine(s) for s in specs] if specs else [Engine(None)]
        self.pooled = bool(specs)
        self.probe_interval = probe_interval
        #: What the user should know (an engine left out), for the request's summary.
        self.notes: list[str] = []
        self._lock = threading.Lock()
        self._images: dict[tuple[str, str], threading.Lock] = {}
        #: (engine incarnation, image or build context) known to be on that engine.
        self._has: set[tuple[str, str]] = set()
        self.run_id: str | None = None  # of the sessions' labels, for the notes

    def engine(self, name: str) -> Engine | None:
        return next((e for e in self.engines if e.name == name), None)

    # -- preflight -------------------------------------------------------
    async def preflight(self, image: str | None, pull: bool) -> None:
        """Ping every engine and make ``image`` available on each; leave out those that fail.

        :raises PreflightError: when no engine is usable.
        """
        reasons = await asyncio.gather(*(asyncio.to_thread(self._preflight_ping, e) for e in self.engines))
        failed = {e.name: r for e, r in zip(self.engines, reasons, strict=True) if r}
        if image and len(failed) < len(self.engines):
            failed.update(await asyncio.to_thread(self._spread_image, image, pull, set(failed)))
        if len(failed) == len(self.engines):
            if not self.pooled:
                raise PreflightError(next(iter(failed.values())))
            listed = "; ".join(f"{name}: {why}" for name, why in failed.items())
            raise PreflightError(f"no Docker engine of the pool is usable ({listed})")
        for engine in self.engines:
            why = failed.get(engine.name)
            if why:
                self._mark_down(engine, why, mid_run=False)
                self.notes.append(f"Docker engine {engine.name} left out: {why}; the run goes on with the others")

    def _preflight_ping(self, engine: Engine) -> str | None:
        try:
            engine.client().ping()
        except PreflightError:
            raise
        except Exception as exc:
            if not self.pooled:
                return (
                    f"the Docker engine at {engine.url} is not reachable ({type(exc).__name__}); "
                    "start it (scripts/start-docker.sh does) or set DOCKER_HOST"
                )
            return f"not reachable ({reason(exc)})"
        return None

    def _spread_image(self, image: str, pull: bool, skip: set[str]) -> dict[str, str]:
        """Make ``image`` available on every engine not in ``skip``; why it failed, per engine."""
        engines: list[Engine] = []
        having: list[Engine] = []
        failed: dict[str, str] = {}
        for engine in (e for e in self.engines if e.name not in skip):
            try:
                found = has_image(engine.client(), image)
            except Exception as exc:  # it answered the ping and died since: left out like one that did not
                if not self.pooled:
                    raise
                failed[engine.name] = f"not reachable ({reason(exc)})"
                continue
            engines.append(engine)
            if found:
                having.append(engine)
        if not engines:
            return failed
        if not having and not pull:
            where = engines[0].url if not self.pooled else "any engine of the pool"
            missing = f"docker image {image!r} is not on the engine at {where}; build or pull it"
            return {**failed, **{e.name: missing for e in engines}}
        for engine in engines:
            if engine in having:
                continue
            try:
                if having:
                    copy_image(having[0].client(), engine.client(), image)
                else:
                    engine.client().images.pull(image)
                self._has.add((engine.incarnation, image))
            except Exception as exc:
                if not self.pooled:
                    raise  # the SDK's own error, as the single engine always reported it
                how = "copying" if having else "pulling"
                failed[engine.name] = f"{how} image {image!r} failed ({reason(exc)})"
        return failed

    # -- placement -------------------------------------------------------
    async def open(self, config: SessionConfig, opener: Opener) -> EnvironmentSession:
        """Open a session on the engine placement picks, holding one of its slots until it closes.

        :raises SessionError: when no engine answers, or the engine stopped answering meanwhile.
        """
        if not self.pooled:  # the environment's one engine: nothing to choose or count
            return await opener(self.engines[0], config)
        self.run_id = self.run_id or config.labels.get("agentcompass.run")
        engine = await self._place(config.placement)
        params = session_params(config.params, config.purpose)  # an evaluation session's own image or build
        try:
            image = None if params.get("from_snapshot") else params.get("image") or params.get("task_image")
            if image:
                await asyncio.to_thread(self._ensure_image, engine, str(image))
            build = params.get("build")
            if build and not params.get("image") and not params.get("from_snapshot"):
                await asyncio.to_thread(self._ensure_bases, engine, BuildSpec.from_params(build))
            session = await opener(engine, config)
        except Exception as exc:
            self.release(engine)
            raise await self.fault(engine, exc) from exc
        except BaseException:
            self.release(engine)
            raise
        return PooledSession(self, engine, session)

    async def _place(self, wanted: str | None) -> Engine:
        while True:
            await self._reprobe()
            with self._lock:
                up = [e for e in self.engines if e.down is None]
                if not up:
                    listed = "; ".join(f"{e.name}: {e.down}" for e in self.engines)
                    raise SessionError(f"no Docker engine answers ({listed})")
                pinned = [e for e in up if e.name == wanted]
                engine = min(pinned or up, key=lambda e: (e.assigned / (e.capacity or 1), self.engines.index(e)))
                engine.assigned += 1
            try:
                await engine.permits.acquire()
            except BaseException:
                self._unassign(engine)
                raise
            if engine.down is None:
                return engine
            self.release(engine)  # it stopped answering while we waited for its slot: place again

    def release(self, engine: Engine) -> None:
        """Give back the slot a session on ``engine`` held (its close, or a container the attempt keeps)."""
        engine.permits.release()
        self._unassign(engine)

    def _unassign(self, engine: Engine) -> None:
        with self._lock:
            engine.assigned -= 1

    async def _reprobe(self) -> None:
        """Probe the engines that are down and due (concurrently); those that answer take work again."""
        now = time.monotonic()
        due = [e for e in self.engines if e.down is not None and e.next_probe <= now]
        if not due:
            return
        for engine in due:
            engine.next_probe = now + self.probe_interval
        reasons = await asyncio.gather(*(asyncio.to_thread(e.probe) for e in due))
        for engine, why in zip(due, reasons, strict=True):
            if why is None:
                log.warning("Docker engine %s answers again: it takes new sessions", engine.name)
                await asyncio.to_thread(self._remove_orphans, engine)
                engine.comebacks += 1  # it may be a fresh engine: what was noted there is looked for again
                engine.down = None

    def _mark_down(self, engine: Engine, why: str, *, mid_run: bool = True) -> None:
        with self._lock:
            if engine.down is not None:
                return
            engine.down = why
            engine.next_probe = time.monotonic() + self.probe_interval
        log.warning("Docker engine %s stopped answering (%s): it gets no new sessions until it does", engine.name, why)
        if mid_run:
            remove = f"docker -H {engine.url} ps -aq --filter label=agentcompass.run={self.run_id or '<run id>'}"
            self.notes.append(
                f"Docker engine {engine.name} stopped answering during the run ({why}); its sessions failed as "
                "environment errors. Containers it held are removed if it answers again during the run; "
                f"else list them with: {remove}"
            )

    async def fault(self, engine: Engine, exc: Exception) -> Exception:
        """``exc`` as the attempt should see it: a :class:`SessionError` naming the engine when
        the engine does not answer any more (marked down), else ``exc`` itself."""
        why = engine.down or await asyncio.to_thread(engine.probe)
        if why is None:
            if type(exc).__name__ == "ChannelException":  # paramiko: the SSH server refused one more channel
                return SessionError(
                    f"the SSH server of engine {engine.name} refused another channel ({exc}): raise MaxSessions "
                    "in its sshd_config (10 by default; each API call and running exec holds one) or lower "
                    "this engine's capacity"
                )
            return exc
        self._mark_down(engine, why)
        return EnvironmentLost(f"the Docker engine {engine.name} stopped answering ({why}); {reason(exc)}")

    # -- images ----------------------------------------------------------
    def _ensure_image(self, engine: Engine, image: str) -> None:
        """Copy ``image`` to ``engine`` from an engine that has it, once (nothing when none has it:
        the session's own image logic builds, pulls or explains)."""
        key = (engine.incarnation, image)
        if key in self._has:
            return
        with self._lock:
            lock = self._images.setdefault(key, threading.Lock())
        with lock:
            if key in self._has:
                return
            client = engine.client()
            if not has_image(client, image):
                source = next(
                    (e for e in self.engines if e is not engine and e.down is None and has_image(e.client(), image)),
                    None,
                )
                if source is None:
                    return
                log.info("copying image %s from engine %s to %s", image, source.name, engine.name)
                copy_image(source.client(), client, image)
            self._has.add(key)

    def _ensure_bases(self, engine: Engine, spec: BuildSpec) -> None:
        """Copy to ``engine`` the images a task's Dockerfile builds ``FROM`` that it lacks and another
        engine has (no registry needed), so the builder can build there; once per engine and context."""
        key = (engine.incarnation, f"build:{spec.context}:{spec.dockerfile}")
        if key in self._has:
            return
        dockerfile = Path(spec.context, spec.dockerfile)
        if dockerfile.is_file():  # else the builder says so
            for _, _, name in from_lines(dockerfile.read_text(encoding="utf-8", errors="replace")):
                if local_base(engine.client(), name) is None:
                    for source in self.engines:
                        found = local_base(source.client(), name) if source is not engine and not source.down else None
                        if found is not None:
                            self._ensure_image(engine, found)
                            break
        self._has.add(key)

    # -- cleanup ---------------------------------------------------------
    async def sweep(
        self, run_id: str, also: Callable[[Any, str], int] | None = None, process: str | None = None
    ) -> int:
        """Remove run ``run_id``'s containers from every engine that answers; the others are noted.

        ``also(client, run_id)`` removes more of the run's leftovers on each engine (its images);
        ``process``: only the containers that process made (:func:`.markers.run_filter`).
        """
        labels = run_filter(run_id, process)
        sweeps = (asyncio.to_thread(self._sweep_one, e, run_id, labels, also) for e in self.engines)
        counts = await asyncio.gather(*sweeps)
        return sum(counts)

    def _sweep_one(self, engine: Engine, run_id: str, labels: list[str], also: Callable[[Any, str], int] | None) -> int:
        try:
            client = engine.client()
            leftovers = client.containers.list(all=True, filters={"label": labels})
            for container in leftovers:
                remove_container(client, container.id)
            if also is not None:
                return len(leftovers) + also(client, run_id)
        except Exception as exc:
            if not self.pooled:
                raise
            log.warning("Docker engine %s: the containers of run %s were not swept: %s", engine.name, run_id, exc)
            return 0
        return len(leftovers)

    def _remove_orphans(self, engine: Engine) -> None:
        while engine.orphans:
            container_id = engine.orphans.pop()
            try:
                remove_container(engine.client(), container_id)
            except Exception as exc:
                log.warning("Docker engine %s: container %s was not removed: %s", engine.name, container_id[:12], exc)

    async def remove_orphans(self) -> None:
        """Remove the containers engines owed (their removal failed while they did not answer), on
        every engine that answers now; the others are said."""
        for engine in self.engines:
            if engine.orphans and await asyncio.to_thread(engine.probe) is None:
                await asyncio.to_thread(self._remove_orphans, engine)
            if engine.orphans:
                log.warning(
                    "Docker engine %s does not answer: remove its containers %s once it does",
                    engine.name,
                    ", ".join(c[:12] for c in engine.orphans),
                )

    async def aclose(self) -> None:
        """Close every engine's clients (after :meth:`remove_orphans`, which needs them)."""
        for engine in self.engines:
            await asyncio.to_thread(engine.close)
