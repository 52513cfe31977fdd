"""Filling the cache: one fetch per (agent, version, recipe), on the host, with the user's own registries.

A *source* (:mod:`.npm`, :mod:`.pip`) knows how to download its files with
the ordinary client (``npm``, ``pip``: their own config, registry and
credentials apply) and which hashes the registry published for them. The
files are checked against those hashes on the way into the cache, and what a
key resolved to is recorded, so the next run (any process, any machine the
folder is copied to) finds it without a registry. Processes take turns per
key through a lock file: a second xdist worker waits for the first one's
download instead of repeating it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import shlex
import shutil
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from ....concurrency.flock import file_lock
from .store import CacheCorrupt, CachedFile, CachedSet, PackageCache

__all__ = ["FetchError", "Fetched", "PackageSource", "cache_key", "ensure_packages", "gather_or_cancel", "run_tool"]

#: Seconds one registry command may take (a 190 MB package on a slow link fits).
TOOL_TIMEOUT = 1800.0
#: Registry commands one fetch runs at once (an agent's packages; the agents of a preflight).
FETCHES_AT_ONCE = 4
T = TypeVar("T")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


class FetchError(Exception):
    """A package could not be fetched or verified; the message says which and why."""


@dataclass(frozen=True)
class Fetched:
    """A downloaded file and the hashes its registry published (algorithm -> hex digest)."""

    path: Path
    expected: Mapping[str, str]
    source: str


class PackageSource(Protocol):
    """Where some of an agent's files come from."""

    def describe(self) -> dict[str, Any]:
        """The recipe as JSON data: part of the cache key, so a change fetches again."""
        ...

    async def fetch(self, into: Path) -> list[Fetched]:
        """Download the files into the folder ``into``.

        :raises FetchError: naming the package, the command and its error.
        """
        ...


def cache_key(agent: str, version: str, sources: Sequence[PackageSource]) -> str:
    """``<agent>-<version>-<digest of the recipes>``: a file name."""
    recipe = json.dumps([s.describe() for s in sources], sort_keys=True)
    digest = hashlib.sha256(recipe.encode()).hexdigest()[:16]
    return _UNSAFE.sub("_", f"{agent}-{version}") + f"-{digest}"


async def run_tool(
    argv: Sequence[str], what: str, env: Mapping[str, str] | None = None, defaults: Mapping[str, str] | None = None
) -> str:
    """Run a registry client and return its stdout.

    :param defaults: Variables set unless this process's environment sets them (the user's settings win).
    :raises FetchError: when it is not installed, fails or takes longer than :data:`TOOL_TIMEOUT`.
    """
    environ = {**(defaults or {}), **os.environ, **(env or {})}
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=environ,
        )
    except FileNotFoundError:
        raise FetchError(f"{argv[0]!r} is not installed on this machine; it is needed to {what}") from None
    try:
        async with asyncio.timeout(TOOL_TIMEOUT):
            out, err = await process.communicate()
    except BaseException as exc:  # a timeout, a cancel: the client must not outlive us
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        if isinstance(exc, TimeoutError):
            raise FetchError(f"`{shlex.join(argv)}` took longer than {TOOL_TIMEOUT:g}s to {what}") from None
        raise
    if process.returncode != 0:
        said = _gist(err.decode("utf-8", "replace")) or _gist(out.decode("utf-8", "replace"))
        raise FetchError(f"`{shlex.join(argv)}` failed (exit {process.returncode}) to {what}:\n{said}")
    return out.decode("utf-8", "replace")


#: Lines of a client's error output that say nothing about the failure (pointers to logs, retries).
_NOISE = re.compile(r"A complete log of this run|WARNING: Retrying|^\s*$|npm (error|ERR!)\s*$", re.IGNORECASE)


#: Lines that name the failure (npm's ``code ECONNREFUSED``, pip's ``ERROR: ...``).
_TELLING = re.compile(r"\b(code|errno)\b|^ERROR:|Error:", re.IGNORECASE)


def _gist(text: str, lines: int = 5, limit: int = 900) -> str:
    """The lines of a client's error output that name the failure, then its last few lines."""
    kept = [line.rstrip() for line in text.splitlines() if not _NOISE.search(line)]
    chosen = dict.fromkeys([*[line for line in kept if _TELLING.search(line)][:3], *kept[-lines:]])
    return "\n".join(chosen)[-limit:]


async def ensure_packages(cache: PackageCache, agent: str, version: str, sources: Sequence[PackageSource]) -> CachedSet:
    """The cached, verified files of ``agent`` ``version``: from the cache, else fetched now.

    :raises FetchError: when they are not cached and cannot be fetched or verified.
    """
    key = cache_key(agent, version, sources)
    # Hashing a cached set reads it whole (once per process): off the event loop.
    found, corrupt = await asyncio.to_thread(_lookup, cache, key)
    if found is not None:
        return found
    lock = cache.lock_file(key)
    lock.parent.mkdir(parents=True, exist_ok=True)
    async with file_lock(lock):
        found, again = await asyncio.to_thread(_lookup, cache, key)  # another process fetched it meanwhile
        if found is not None:
            return found
        corrupt = again or corrupt
        # What a damaged set still holds intact, by source: only the sources of damaged files are fetched again.
        kept = await asyncio.to_thread(_intact, cache, key, len(sources)) if corrupt else None
        kept = kept or [None] * len(sources)
        await asyncio.to_thread(cache.discard, key)
        scratch = cache.scratch()
        try:
            wanted = [source for source, intact in zip(sources, kept, strict=True) if intact is None]
            fetched = iter(await _fetch(cache, scratch, wanted))
            groups = [intact if intact is not None else next(fetched) for intact in kept]
        except FetchError as exc:
            raise FetchError(f"{corrupt}, and fetching it again failed: {exc}" if corrupt else str(exc)) from None
        finally:
            await asyncio.to_thread(shutil.rmtree, scratch, True)
        cached = await asyncio.to_thread(cache.make_set, [f for group in groups for f in group])
        recipe = {"agent": agent, "version": version, "sources": [s.describe() for s in sources]}
        recipe["files"] = [[f.name for f in group] for group in groups]  # by source: a repair fetches one again
        cache.record(key, cached, recipe)
    return cached


def _intact(cache: PackageCache, key: str, count: int) -> list[list[CachedFile] | None] | None:
    """Per source of ``key``'s damaged set: its files when all are intact, ``None`` when one is damaged
    (or the whole answer ``None`` when the index does not say which source gave which file)."""
    try:
        entry = json.loads(cache.index_file(key).read_text())
        groups = entry["recipe"]["files"]
        files = {f.name: f for f in cache.manifest(str(entry["set"]))}
    except (OSError, ValueError, KeyError, TypeError, CacheCorrupt):
        return None
    if not isinstance(groups, list) or len(groups) != count:
        return None
    out: list[list[CachedFile] | None] = []
    for names in groups:
        entries = [files.get(str(name)) for name in names]
        good = all(e is not None and cache.intact(e) for e in entries)
        out.append([e for e in entries if e is not None] if good else None)
    return out


async def _fetch(cache: PackageCache, scratch: Path, sources: Sequence[PackageSource]) -> list[list[CachedFile]]:
    """Fetch every source at once (a few at a time); the first failure stops the others. Its files, by source."""
    limit = asyncio.Semaphore(FETCHES_AT_ONCE)

    async def one(source: PackageSource) -> list[CachedFile]:
        async with limit:
            fetched = await source.fetch(scratch)
        try:
            return [await asyncio.to_thread(cache.add_file, f.path, f.expected, f.source) for f in fetched]
        except CacheCorrupt as exc:
            raise FetchError(str(exc)) from None

    return await gather_or_cancel([one(source) for source in sources])


async def gather_or_cancel(work: Sequence[Coroutine[Any, Any, T]]) -> list[T]:
    """The results of ``work`` run at once; when one fails, the rest are cancelled (and awaited) first."""
    tasks = [asyncio.ensure_future(w) for w in work]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def _lookup(cache: PackageCache, key: str) -> tuple[CachedSet | None, str]:
    """The cached set of ``key``, or ``None`` and why it is not usable (empty when not cached)."""
    try:
        return cache.lookup(key), ""
    except CacheCorrupt as exc:  # fetched again (only what is damaged, when the index says by source)
        return None, f"the cache had a damaged copy ({exc})"
