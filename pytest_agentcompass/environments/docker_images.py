"""Building task images for the ``docker`` provider, once per run, through the Docker SDK.

A task that brings a build context (a folder with a Dockerfile) gets an image
tagged by a digest of that context and of its ``FROM`` images' ids: a second
run finds the tag and builds nothing, and tasks with identical contexts share
one image. Within one process every tag is built at most once at a time
(later attempts wait for it; a failure is memoised per run); xdist workers of
one run take turns through a lock file in the run directory; at most
``max_parallel`` builds run at once; each build is bounded by its timeout, and
its log is written to the run directory. A ``FROM`` image the engine lacks is
replaced by the local image of the same short name (see :func:`local_base`).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import os
import re
import threading
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import SessionError

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
#: The name a Dockerfile with rewritten ``FROM`` lines gets in the build context.
REWRITTEN = ".agentcompass.Dockerfile"
#: Lines of the build log quoted in the error of a failed build.
LOG_TAIL_LINES = 25
#: Seconds between tries for a build lock another process holds.
_LOCK_POLL = 0.2


@dataclass(frozen=True)
class BuildSpec:
    """One image to build: ``dockerfile`` (relative to ``context``) within ``timeout`` seconds."""

    context: str
    dockerfile: str = "Dockerfile"
    timeout: float | None = None

    @classmethod
    def from_params(cls, value: Mapping[str, Any]) -> BuildSpec:
        timeout = value.get("timeout")
        return cls(
            context=str(value["context"]),
            dockerfile=str(value.get("dockerfile") or "Dockerfile"),
            timeout=float(timeout) if timeout else None,
        )


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


_FROM = re.compile(r"^\s*FROM\s+(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?", re.IGNORECASE | re.MULTILINE)


def local_base(client: Any, ref: str) -> str | None:
    """The local image to build ``FROM ref`` on: ``ref`` itself when the engine has it, else the
    same image by its short name (``public.ecr.aws/docker/library/debian:bookworm-slim@sha256:...``
    -> ``debian:bookworm-slim``) when the engine has that: how published tasks build offline
    on locally made base images. ``None`` when neither is there."""
    if has_image(client, ref):
        return ref
    name = ref.split("@", 1)[0]
    parts = name.split("/")
    if len(parts) > 1 and ("." in parts[0] or ":" in parts[0] or parts[0] == "localhost"):
        parts = parts[1:]  # a registry host
    while len(parts) > 1 and parts[0] in ("docker", "library"):
        parts = parts[1:]
    short = "/".join(parts)
    if ":" not in parts[-1]:
        short += ":latest"
    return short if short != ref and has_image(client, short) else None


def from_lines(dockerfile_text: str) -> list[tuple[int, int, str]]:
    """``(start, end, image)`` of every ``FROM`` image that is not a build stage, ``scratch`` or an ``ARG``."""
    stages: set[str] = set()
    found: list[tuple[int, int, str]] = []
    for match in _FROM.finditer(dockerfile_text):
        name, alias = match.group(1), match.group(2)
        if name.lower() != "scratch" and name not in stages and "$" not in name:
            found.append((match.start(1), match.end(1), name))
        if alias:
            stages.add(alias)
    return found


def base_images(client: Any, dockerfile: Path) -> dict[str, str]:
    """The images ``dockerfile`` builds ``FROM`` -> the ids of the local images used for them."""
    found: dict[str, str] = {}
    for _, _, name in from_lines(dockerfile.read_text(encoding="utf-8", errors="replace")):
        local = local_base(client, name)
        found[name] = str(client.images.get(local).id) if local else "absent"  # the build will say so
    return found


def rewrite_bases(client: Any, dockerfile_text: str) -> tuple[str, list[str]]:
    """``dockerfile_text`` with every ``FROM`` image the engine lacks replaced by its local
    short-name twin (see :func:`local_base`), and a note per replacement."""
    notes: list[str] = []
    text = dockerfile_text
    for start, end, name in reversed(from_lines(dockerfile_text)):
        local = local_base(client, name)
        if local is not None and local != name:
            text = text[:start] + local + text[end:]
            notes.append(f"FROM {name}: not on the engine, using the local image {local}")
    return text, notes[::-1]


def image_tag(client: Any, context: Path, dockerfile: str = "Dockerfile") -> str:
    """The tag the image of ``context`` gets (and is looked up by)."""
    return f"{REPOSITORY}:{context_digest(context, dockerfile, base_images(client, context / dockerfile))}"


class ImageBuilder:
    """Builds and caches the images of one provider (one pytest process)."""

    def __init__(self, max_parallel: int = 2) -> None:
        self.max_parallel = max(1, max_parallel)
        #: Failed builds, per tag and run (log folder): later attempts of that run get the same error.
        #: Successes need no memo: the engine has the tag, which ``_build`` checks first.
        self._failed: dict[tuple[str, Path | None, str], SessionError] = {}
        #: Images this run already has, by context and run: later attempts skip the digest and the lookups.
        self._ready: dict[tuple[str, str, Path | None, str], str] = {}
        # Futures and the semaphore belong to one event loop; an xdist worker
        # runs each task in a loop of its own, so they are renewed per loop.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots = asyncio.Semaphore(self.max_parallel)
        self._builds: dict[tuple[str, str], asyncio.Future[str]] = {}

    async def ensure(self, client: Any, spec: BuildSpec, log_dir: Path | None, engine: str = "") -> str:
        """The tag of ``spec``'s image, built now unless the engine has it (``engine`` names the
        engine of ``client`` when there are several: each gets its own build).

        :raises SessionError: when the build fails or times out, with the log tail.
        """
        ready = self._ready.get((spec.context, spec.dockerfile, log_dir, engine))
        if ready is not None:
            return ready
        context = Path(spec.context)
        if not (context / spec.dockerfile).is_file():
            raise SessionError(f"no Dockerfile at {context / spec.dockerfile}")
        tag = await asyncio.to_thread(image_tag, client, context, spec.dockerfile)
        failed = self._failed.get((tag, log_dir, engine))
        if failed is not None:
            raise SessionError(str(failed))
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop, self._slots, self._builds = loop, asyncio.Semaphore(self.max_parallel), {}
        build = self._builds.get((tag, engine))
        if build is None:
            build = self._builds[(tag, engine)] = asyncio.ensure_future(
                self._build_once(client, spec, tag, log_dir, engine)
            )
        # Shielded: one cancelled waiter must not cancel the build others wait for.
        return await asyncio.shield(build)

    async def _build_once(self, client: Any, spec: BuildSpec, tag: str, log_dir: Path | None, engine: str) -> str:
        try:
            ready = await self._build(client, spec, tag, log_dir, engine)
            self._ready[(spec.context, spec.dockerfile, log_dir, engine)] = ready
            return tag
        except SessionError as exc:
            self._failed[(tag, log_dir, engine)] = exc
            raise
        finally:
            self._builds.pop((tag, engine), None)

    async def _build(self, client: Any, spec: BuildSpec, tag: str, log_dir: Path | None, engine: str) -> str:
        if await asyncio.to_thread(has_image, client, tag):
            return tag  # built by an earlier run
        name = tag.replace(":", "-")
        if engine:  # one lock and log per engine: engines of a pool build side by side
            name += "-" + hashlib.sha256(engine.encode()).hexdigest()[:8]
        if log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)
        # xdist workers share the run directory: a lock file there makes the
        # second worker wait for the first one's build instead of repeating it.
        async with _file_lock(log_dir / f"{name}.lock" if log_dir else None):
            if await asyncio.to_thread(has_image, client, tag):
                return tag  # another worker built it meanwhile
            async with self._slots:
                job = _BuildJob(client, spec, tag, log_dir / f"{name}.log" if log_dir else None)
                worker = asyncio.ensure_future(asyncio.to_thread(job.run))
                try:
                    await asyncio.wait_for(asyncio.shield(worker), spec.timeout)
                except TimeoutError:
                    job.abort()
                    await worker
                    raise SessionError(
                        f"building the image of {spec.context} timed out after {spec.timeout:g}s"
                        f"{job.where()}\n{job.tail()}"
                    ) from None
                except asyncio.CancelledError:
                    job.abort()
                    await asyncio.shield(worker)
                    raise
        if job.error is not None:
            raise SessionError(f"building the image of {spec.context} failed: {job.error}{job.where()}\n{job.tail()}")
        return tag


@contextlib.asynccontextmanager
async def _file_lock(path: Path | None) -> AsyncIterator[None]:
    """An exclusive ``flock`` on ``path`` (nothing without a path), polled so no thread blocks on it."""
    if path is None:
        yield
        return
    with path.open("a") as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                await asyncio.sleep(_LOCK_POLL)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


_shared: ImageBuilder | None = None


def shared_builder(max_parallel: int = 2) -> ImageBuilder:
    """The process's builder: requests sharing an image share its one build (the first caller
    sets the number of parallel builds)."""
    global _shared
    if _shared is None:
        _shared = ImageBuilder(max_parallel)
    return _shared


class _BuildJob:
    """One blocking build, run in a worker thread; :meth:`abort` closes its stream."""

    def __init__(self, client: Any, spec: BuildSpec, tag: str, log_path: Path | None) -> None:
        self.client = client
        self.spec = spec
        self.tag = tag
        self.log_path = log_path
        self.lines: list[str] = []
        self.error: str | None = None
        self._response: Any = None
        self._lock = threading.Lock()
        self._aborted = False

    def where(self) -> str:
        return f" (build log: {self.log_path})" if self.log_path else ""

    def tail(self) -> str:
        return "".join(self.lines[-LOG_TAIL_LINES:]).rstrip()

    def abort(self) -> None:
        with self._lock:
            self._aborted = True
            if self._response is not None:
                self._response.close()  # the engine cancels a build whose client went away

    def run(self) -> None:
        from docker.utils.build import tar

        api = self.client.api
        context = self.spec.context
        ignore = Path(context, ".dockerignore")
        exclude = [
            line.strip() for line in (ignore.read_text().splitlines() if ignore.is_file() else []) if line.strip()
        ]
        log = self.log_path.open("w", encoding="utf-8") if self.log_path else None
        try:
            original = Path(context, self.spec.dockerfile).read_text(encoding="utf-8", errors="replace")
            rewritten, notes = rewrite_bases(self.client, original)
            for note in notes:
                self._log(f"agentcompass: {note}\n", log)
            # A rewritten Dockerfile travels beside the context's own files, under a name of its own.
            dockerfile = (REWRITTEN, rewritten) if notes else (self.spec.dockerfile, None)
            with tar(context, exclude=exclude, dockerfile=dockerfile) as payload:
                # The SDK's build() hides its HTTP response; posting ourselves keeps
                # a handle to close, which is how a timed-out build is stopped.
                response = api._post(
                    api._url("/build"),
                    data=payload,
                    params={"t": self.tag, "dockerfile": dockerfile[0], "rm": True, "forcerm": True},
                    headers={"Content-Type": "application/tar"},
                    stream=True,
                    timeout=None,
                )
                with self._lock:
                    if self._aborted:
                        response.close()
                        return
                    self._response = response
                if response.status_code >= 400:
                    self.error = f"the engine refused the build: {response.text.strip()}"
                    self._log(self.error + "\n", log)
                    return
                for chunk in api._stream_helper(response, decode=True):
                    text = chunk.get("stream") or chunk.get("status") or ""
                    if "error" in chunk:
                        self.error = str(chunk.get("error", "")).strip()
                        text = f"ERROR: {self.error}\n"
                    if text:
                        self._log(text, log)
        except Exception as exc:
            if not self._aborted:
                self.error = f"{type(exc).__name__}: {exc}"
                self._log(f"ERROR: {self.error}\n", log)
        finally:
            if log is not None:
                log.close()
            if self._response is not None:
                self._response.close()
        if self.error is None and not self._aborted and not has_image(self.client, self.tag):
            self.error = "the build ended without producing the image"

    def _log(self, text: str, log: Any) -> None:
        self.lines.append(text)
        if len(self.lines) > 4 * LOG_TAIL_LINES:
            del self.lines[:-LOG_TAIL_LINES]
        if log is not None:
            log.write(text)


def has_image(client: Any, tag: str) -> bool:
    try:
        client.images.get(tag)
    except Exception:
        return False
    return True


async def choose_image(client: Any, params: Mapping[str, Any], log_dir: Path | None, engine: str = "") -> str:
    """The image a session starts from: ``image``; else the task's prebuilt ``task_image`` when
    the engine has it; else one built from the task's ``build`` context; else ``task_image`` pulled.

    :raises SessionError: for a task that cannot run here (``unavailable``, GPUs) or has no image.
    """
    if params.get("unavailable"):
        raise SessionError(str(params["unavailable"]))
    gpus = int(params.get("gpus") or 0)
    if gpus > 0:
        raise SessionError(f"the task needs {gpus} GPU(s), but the docker provider does not expose GPUs")
    if params.get("image"):
        return str(params["image"])
    prebuilt = params.get("task_image")
    if prebuilt and await asyncio.to_thread(has_image, client, prebuilt):
        return str(prebuilt)
    if params.get("build"):
        builder = shared_builder(int(params.get("max_parallel_builds", 2)))
        return await builder.ensure(client, BuildSpec.from_params(params["build"]), log_dir, engine)
    if prebuilt and params.get("pull"):
        await asyncio.to_thread(client.images.pull, prebuilt)
        return str(prebuilt)
    if prebuilt:
        raise SessionError(
            f"image {prebuilt!r} (the task's) is not on the engine and the task has no Dockerfile to build "
            "instead; pull it, or set environment.params.pull: true"
        )
    raise SessionError(
        "environment 'docker' needs params.image, or a benchmark that gives each task an image or a Dockerfile"
    )
