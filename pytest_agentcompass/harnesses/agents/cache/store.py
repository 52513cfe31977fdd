"""The cache folder: content-addressed files, the sets an agent installs from, and their index.

Layout under the cache root::

    blobs/sha256/<hex>          every fetched file once, named by its SHA-256, read-only
    sets/<digest>/<file name>   one agent version's files (hard links to blobs) + manifest.json
    index/<key>.json            what an (agent, version, fetch recipe) resolved to: its set
    tmp/                        downloads in progress (removed when done)
    locks/<key>.lock            one per key: processes take turns fetching it

A set's digest is a digest of its file names and hashes, so two recipes that
resolve to the same files share one set, and versions that share files
(most of a Python dependency tree) share their blobs. A set folder is what a
container gets (read-only) to install from. The folder can be copied to a
machine without a registry: lookups read only ``index/`` and ``sets/``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CacheCorrupt", "CachedFile", "CachedSet", "PackageCache", "default_cache_dir", "file_digests"]

_BLOCK = 1 << 20


class CacheCorrupt(Exception):
    """A cached file is missing or does not match its recorded hash."""


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/pytest-agentcompass/agents`` (``~/.cache/...`` by default)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pytest-agentcompass" / "agents"


def file_digests(path: Path, algorithms: Iterable[str] = ("sha256",)) -> dict[str, str]:
    """Hex digests of ``path`` for each algorithm, reading the file once."""
    hashers = {name: hashlib.new(name) for name in dict.fromkeys(algorithms)}
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(_BLOCK), b""):
            for hasher in hashers.values():
                hasher.update(block)
    return {name: hasher.hexdigest() for name, hasher in hashers.items()}


@dataclass(frozen=True)
class CachedFile:
    name: str
    sha256: str
    size: int
    #: Where it came from (a registry URL or package spec), for people.
    source: str = ""


@dataclass(frozen=True)
class CachedSet:
    """The files one agent version installs from, in one folder."""

    digest: str
    path: Path
    files: tuple[CachedFile, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "digest": self.digest,
            "files": [{"name": f.name, "sha256": f.sha256, "size": f.size, "source": f.source} for f in self.files],
        }


def _set_digest(files: Iterable[CachedFile]) -> str:
    lines = "".join(f"{f.name} {f.sha256}\n" for f in sorted(files, key=lambda f: f.name))
    return hashlib.sha256(lines.encode()).hexdigest()[:32]


class PackageCache:
    """One cache folder (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        #: Sets whose files were hashed by this process (by folder and file stamps): checked once per process.
        self._verified: set[tuple[str, tuple[tuple[str, int, int], ...]]] = set()

    # -- paths ---------------------------------------------------------------
    def blob(self, sha256: str) -> Path:
        return self.root / "blobs" / "sha256" / sha256

    def index_file(self, key: str) -> Path:
        return self.root / "index" / f"{key}.json"

    def lock_file(self, key: str) -> Path:
        return self.root / "locks" / f"{key}.lock"

    def scratch(self) -> Path:
        """A new folder for one fetch's downloads (inside the cache: a rename into blobs never copies)."""
        parent = self.root / "tmp"
        parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix="fetch-", dir=parent))

    # -- writing -------------------------------------------------------------
    def add_file(self, path: Path, expected: Mapping[str, str], source: str, name: str | None = None) -> CachedFile:
        """Move the downloaded ``path`` into the blobs once its hashes match ``expected`` (algorithm -> hex).

        :raises CacheCorrupt: when a hash differs (the file is deleted).
        """
        digests = file_digests(path, ("sha256", *expected))
        for algorithm, want in expected.items():
            if digests[algorithm] != want.lower():
                path.unlink(missing_ok=True)
                raise CacheCorrupt(
                    f"{name or path.name} from {source}: its {algorithm} is {digests[algorithm]}, "
                    f"but the registry published {want.lower()}; the file was discarded"
                )
        sha256 = digests["sha256"]
        blob = self.blob(sha256)
        size = path.stat().st_size
        blob.parent.mkdir(parents=True, exist_ok=True)
        path.chmod(0o444)
        os.replace(path, blob)  # the checked file wins over whatever had its name
        return CachedFile(name or path.name, sha256, size, source)

    def make_set(self, files: Iterable[CachedFile]) -> CachedSet:
        """The set of ``files`` (already in the blobs), made once: a folder of links and a manifest."""
        unique = {f.name: f for f in files}
        digest = _set_digest(unique.values())
        folder = self.root / "sets" / digest
        cached = CachedSet(digest, folder, tuple(sorted(unique.values(), key=lambda f: f.name)))
        if (folder / "manifest.json").is_file():
            return cached
        staging = Path(str(folder) + f".tmp{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        for entry in cached.files:
            try:
                os.link(self.blob(entry.sha256), staging / entry.name)
            except OSError:  # a file system without hard links: a copy
                shutil.copy2(self.blob(entry.sha256), staging / entry.name)
        (staging / "manifest.json").write_text(json.dumps(cached.to_json(), indent=1) + "\n")
        try:
            os.rename(staging, folder)
        except OSError:  # made meanwhile by another process (same content: its digest)
            shutil.rmtree(staging, ignore_errors=True)
        return cached

    def record(self, key: str, cached: CachedSet, recipe: Mapping[str, Any]) -> None:
        """Remember that ``key`` resolved to ``cached`` (written whole or not at all)."""
        target = self.index_file(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_suffix(f".tmp{os.getpid()}")
        temporary.write_text(json.dumps({"set": cached.digest, "recipe": recipe}, indent=1, sort_keys=True) + "\n")
        os.replace(temporary, target)

    # -- reading -------------------------------------------------------------
    def lookup(self, key: str) -> CachedSet | None:
        """The set ``key`` resolved to, its files checked against their hashes; ``None`` when not cached.

        :raises CacheCorrupt: when the index names a set whose files are missing or altered.
        """
        try:
            entry = json.loads(self.index_file(key).read_text())
            digest = str(entry["set"])
        except (FileNotFoundError, NotADirectoryError):
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CacheCorrupt(f"{self.index_file(key)} is unreadable ({exc}); delete it to fetch again") from None
        return self.load_set(digest)

    def manifest(self, digest: str) -> tuple[CachedFile, ...]:
        """The files set ``digest`` records (unchecked).

        :raises CacheCorrupt: when its manifest is missing or unreadable.
        """
        folder = self.root / "sets" / digest
        try:
            manifest = json.loads((folder / "manifest.json").read_text())
            return tuple(
                CachedFile(str(f["name"]), str(f["sha256"]), int(f["size"]), str(f.get("source", "")))
                for f in manifest["files"]
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CacheCorrupt(f"{folder}/manifest.json is missing or unreadable ({exc})") from None

    def intact(self, entry: CachedFile) -> bool:
        """Whether the blob of ``entry`` is there and matches its size and SHA-256 (read whole)."""
        blob = self.blob(entry.sha256)
        try:
            return blob.stat().st_size == entry.size and file_digests(blob)["sha256"] == entry.sha256
        except OSError:
            return False

    def load_set(self, digest: str) -> CachedSet:
        folder = self.root / "sets" / digest
        cached = CachedSet(digest, folder, self.manifest(digest))
        self.verify(cached)
        return cached

    def verify(self, cached: CachedSet) -> None:
        """Check every file of ``cached`` against its recorded size and SHA-256 (hashed once per process).

        :raises CacheCorrupt: naming the first file that is missing or differs.
        """
        stamps = []
        for entry in cached.files:
            path = cached.path / entry.name
            try:
                st = path.stat()
            except OSError:
                raise CacheCorrupt(f"{path} is missing from the cache") from None
            if st.st_size != entry.size:
                raise CacheCorrupt(f"{path} has {st.st_size} bytes, the manifest says {entry.size}")
            stamps.append((entry.name, st.st_ino, st.st_mtime_ns))
        seen = (str(cached.path), tuple(stamps))
        if seen in self._verified:
            return
        for entry in cached.files:
            path = cached.path / entry.name
            actual = file_digests(path)["sha256"]
            if actual != entry.sha256:
                raise CacheCorrupt(f"{path} does not match its recorded sha256 ({actual} != {entry.sha256})")
        self._verified.add(seen)

    def discard(self, key: str) -> None:
        """Forget ``key`` and the set it named (a fetch makes them again; blobs are replaced as they come)."""
        try:
            digest = str(json.loads(self.index_file(key).read_text())["set"])
        except (OSError, ValueError, KeyError, TypeError):
            digest = ""
        if digest and "/" not in digest and digest not in (".", ".."):
            shutil.rmtree(self.root / "sets" / digest, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            self.index_file(key).unlink()
