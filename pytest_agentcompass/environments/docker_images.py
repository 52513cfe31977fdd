"""Building task images for the ``docker`` provider, once per run, through the Docker SDK.

A task that brings a build context (a folder with a Dockerfile) gets an image
tagged by a digest of that context and of its ``FROM`` images' ids: a second
run finds the tag and builds nothing, and tasks with identical contexts share
one image. Within one process every tag is built at most once at a time
(later attempts wait for it; a failure is memoised per run); xdist workers of
one host take turns through a lock file; at most
``max_parallel`` builds run at once; each build is bounded by its timeout, and
its log is written to the run directory's ``images/`` through the store (the
provider's ``run_files``). A ``FROM`` image the engine lacks is
replaced by the local image of the same short name (see :func:`local_base`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..concurrency.flock import file_lock
from ..vocabulary.artifacts import RunFiles
from ..vocabulary.errors import SessionError, TaskSetupError
from .docker_bases import base_images, has_image, local_base, rewrite_bases
from .docker_build import BuildJob, BuildSpec

__all__ = [
    "BuildSpec",
    "ImageBuilder",
    "choose_image",
    "base_images",
    "context_digest",
    "has_image",
    "image_tag",
    "local_base",
    "rewrite_bases",
    "shared_builder",
]

#: Image repository of every built task image (the tag is the context digest).
REPOSITORY = "agentcompass-task"


def context_digest(context: Path, dockerfile: str = "Dockerfile", bases: Mapping[str, str] | None = None) -> str:
    """A digest of every file under ``context`` (path, executable bit, content, link target)
    and of the ids of the images it builds ``FROM`` (``bases``: name -> id).

    Conservative on purpose: a file ``.dockerignore`` leaves out still counts,
    so an edit can cause a rebuild but never a stale image; a base image
    rebuilt under the same name gives a new tag too.
    """
    digest = hashlib.sha256(f"dockerfile={dockerfile}\n".encode())
    for name, image_id in sorted((bases or {}).items()):
        digest.update(f"B {name} {image_id}\n".encode())
    for root, dirs, files in os.walk(context):
        dirs.sort()
        for name in sorted(files):
            path = Path(root, name)
            rel = path.relative_to(context).as_posix()
            if path.is_symlink():
                digest.update(f"L {rel} {os.readlink(path)}\n".encode())
                continue
            mode = path.stat().st_mode
            digest.update(f"F {rel} {int(bool(mode & 0o111))} {path.stat().st_size}\n".encode())
            with path.open("rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()[:24]


def image_tag(
    client: Any, context: Path, dockerfile: str = "Dockerfile", known_bases: dict[str, str] | None = None
) -> str:
    """The tag the image of ``context`` gets (and is looked up by); ``known_bases``: see :func:`base_images`."""
    bases = base_images(client, context / dockerfile, known_bases)
    return f"{REPOSITORY}:{context_digest(context, dockerfile, bases)}"


class ImageBuilder:
    """Builds and caches the images of one provider (one pytest process)."""

    def __init__(self, max_parallel: int = 2, engine: str = "") -> None:
        self.max_parallel = max(1, max_parallel)
        #: The engine it builds on, when there are several (a pool): its lock and log files are its own.
        self.engine = engine
        #: Failed builds, per tag and run (its files): later attempts of that run get the same error.
        #: Successes need no memo: the engine has the tag, which ``_build`` checks first.
        self._failed: dict[tuple[str, RunFiles | None], SessionError] = {}
        #: Images this run already has, by context and run: later attempts skip the digest and the lookups.
        self._ready: dict[tuple[str, str, RunFiles | None], str] = {}
        #: Per run: ids of the FROM images met so far, and the tags known to be on the engine
        #: (tasks with identical contexts in different folders share both).
        self._bases: dict[RunFiles | None, dict[str, str]] = {}
        self._present: set[tuple[str, RunFiles | None]] = set()
        # Futures and the semaphore belong to one event loop; an xdist worker
        # runs each task in a loop of its own, so they are renewed per loop.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots = asyncio.Semaphore(self.max_parallel)
        self._builds: dict[str, asyncio.Future[str]] = {}

    async def ensure(self, client: Any, spec: BuildSpec, files: RunFiles | None) -> str:
        """The tag of ``spec``'s image, built now unless the engine has it.

        :raises SessionError: when the build fails or times out, with the log tail.
        """
        ready = self._ready.get((spec.context, spec.dockerfile, files))
        if ready is not None:
            return ready
        context = Path(spec.context)
        if not (context / spec.dockerfile).is_file():
            raise SessionError(f"no Dockerfile at {context / spec.dockerfile}")
        known = self._bases.setdefault(files, {})
        tag = await asyncio.to_thread(image_tag, client, context, spec.dockerfile, known)
        if (tag, files) in self._present:
            self._ready[(spec.context, spec.dockerfile, files)] = tag
            return tag
        failed = self._failed.get((tag, files))
        if failed is not None:
            raise SessionError(str(failed))
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop, self._slots, self._builds = loop, asyncio.Semaphore(self.max_parallel), {}
        build = self._builds.get(tag)
        if build is None:
            build = self._builds[tag] = asyncio.ensure_future(self._build_once(client, spec, tag, files))
        # Shielded: one cancelled waiter must not cancel the build others wait for.
        return await asyncio.shield(build)

    async def _build_once(self, client: Any, spec: BuildSpec, tag: str, files: RunFiles | None) -> str:
        try:
            self._ready[(spec.context, spec.dockerfile, files)] = await self._build(client, spec, tag, files)
            self._present.add((tag, files))
            return tag
        except SessionError as exc:
            self._failed[(tag, files)] = exc
            raise
        finally:
            self._builds.pop(tag, None)

    async def _build(self, client: Any, spec: BuildSpec, tag: str, files: RunFiles | None) -> str:
        if await asyncio.to_thread(has_image, client, tag):
            return tag  # built by an earlier run
        name = tag.replace(":", "-")
        if self.engine:  # engines of a pool build side by side
            name += "-" + hashlib.sha256(self.engine.encode()).hexdigest()[:8]
        # Processes of one host (xdist workers, whatever request they run) take
        # turns per tag: the second waits for the first one's build instead of
        # repeating it at the same moment.
        async with file_lock(Path(tempfile.gettempdir()) / f"agentcompass-build-{name}.lock"):
            if await asyncio.to_thread(has_image, client, tag):
                return tag  # another worker built it meanwhile
            async with self._slots:
                log = files.open_text(f"images/{name}.log") if files is not None else contextlib.nullcontext(None)
                with log as text:
                    job = BuildJob(client, spec, tag, text)
                    worker = asyncio.ensure_future(asyncio.to_thread(job.run))
                    try:
                        await asyncio.wait_for(asyncio.shield(worker), spec.timeout)
                    except TimeoutError:
                        await asyncio.to_thread(job.abort)
                        await worker
                        raise SessionError(
                            f"building the image of {spec.context} timed out after {spec.timeout:g}s "
                            f"([environment] build_timeout_sec); the build was stopped{job.where()}\n{job.tail()}"
                        ) from None
                    except asyncio.CancelledError:
                        await asyncio.shield(asyncio.to_thread(job.abort))
                        await asyncio.shield(worker)
                        raise
        if job.error is not None:
            # A Dockerfile that does not build is the task's fault: no retry builds it.
            fault = TaskSetupError if job.task_fault else SessionError
            raise fault(f"building the image of {spec.context} failed: {job.error}{job.where()}\n{job.tail()}")
        return tag


_shared: dict[tuple[str, int], ImageBuilder] = {}


def shared_builder(max_parallel: int = 2, engine: str = "", comebacks: int = 0) -> ImageBuilder:
    """The process's builder for ``engine`` (one per engine of a pool): requests sharing an image
    share its one build (the first caller sets the number of parallel builds). A new one once the
    engine came back from an outage (``comebacks``): it may be a fresh engine, without the images
    the last one knew were there."""
    builder = _shared.get((engine, comebacks))
    if builder is None:
        builder = _shared[engine, comebacks] = ImageBuilder(max_parallel, engine)
    return builder


async def choose_image(
    client: Any, params: Mapping[str, Any], files: RunFiles | None, engine: str = "", comebacks: int = 0
) -> str:
    """The image a session starts from: ``image``; else the task's prebuilt ``task_image`` when
    the engine has it; else one built from the task's ``build`` context; else ``task_image`` pulled.

    :raises TaskSetupError: for a task that cannot run here (``unavailable``, GPUs) or has no image
        (``no_image``: the benchmark's reason).
    :raises SessionError: for a build that failed for a reason outside the task.
    """
    if params.get("unavailable"):
        raise TaskSetupError(str(params["unavailable"]))
    gpus = int(params.get("gpus") or 0)
    if gpus > 0:
        raise TaskSetupError(f"the task needs {gpus} GPU(s), but the docker provider does not expose GPUs")
    if params.get("image"):
        return str(params["image"])
    prebuilt = params.get("task_image")
    if prebuilt and await asyncio.to_thread(has_image, client, prebuilt):
        return str(prebuilt)
    if params.get("build"):
        builder = shared_builder(int(params.get("max_parallel_builds", 2)), engine, comebacks)
        return await builder.ensure(client, BuildSpec.from_params(params["build"]), files)
    if prebuilt and params.get("pull"):
        await asyncio.to_thread(client.images.pull, prebuilt)
        return str(prebuilt)
    if prebuilt:
        raise TaskSetupError(
            f"image {prebuilt!r} (the task's) is not on the engine and the task has no Dockerfile to build "
            "instead; pull it, or set environment.params.pull: true"
        )
    if params.get("no_image"):  # the benchmark says why its task has none (a folder it lacks)
        raise TaskSetupError(str(params["no_image"]))
    raise TaskSetupError(
        "environment 'docker' needs params.image, or a benchmark that gives each task an image or a Dockerfile"
    )
