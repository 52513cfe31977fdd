"""The agent package cache, filled by the real ``npm`` and ``pip`` from registries on loopback."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_agentcompass.harnesses.agents.cache import (
    FetchError,
    NpmPackage,
    PackageCache,
    PipWheels,
    cache_key,
    ensure_packages,
)

from registries import LocalRegistry, local_registry, npm_tarball, wheel

NPM = shutil.which("npm")


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalRegistry]:
    """A loopback registry that ``npm`` and ``pip`` use through their ordinary configuration."""
    with local_registry() as served:
        served.add_npm("@acme/agent", "1.2.3", npm_tarball({"bin/agent": "#!/bin/sh\necho agent 1.2.3\n"}))
        name, data = wheel("acme-tool", "0.4.0")
        served.add_wheel("acme-tool", name, data)
        monkeypatch.setenv("npm_config_registry", served.npm_url)
        monkeypatch.setenv("npm_config_cache", str(tmp_path / "npm-cache"))  # npm's own cache: not ours
        monkeypatch.setenv("npm_config_fetch_retries", "0")  # a refused tarball is not retried for a minute
        monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
        monkeypatch.setenv("PIP_INDEX_URL", served.pip_url)
        monkeypatch.setenv("PIP_CACHE_DIR", str(tmp_path / "pip-cache"))
        yield served


def unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    """No registry at all: both clients fail at once when asked."""
    monkeypatch.setenv("npm_config_registry", "http://127.0.0.1:9/")
    monkeypatch.setenv("npm_config_fetch_retries", "0")
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple/")
    monkeypatch.setenv("PIP_RETRIES", "0")


def fill(cache: PackageCache, *sources: NpmPackage | PipWheels) -> object:
    return asyncio.run(ensure_packages(cache, "acme", "1.2.3", list(sources)))


@pytest.mark.skipif(NPM is None, reason="npm is not installed")
def test_npm_and_pip_fill_the_cache_once_and_a_filled_cache_needs_no_registry(
    tmp_path: Path, registry: LocalRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    sources = (NpmPackage("@acme/agent", "1.2.3"), PipWheels(("acme-tool==0.4.0",), ("3.11",)))
    cache = PackageCache(tmp_path / "cache")
    cached = fill(cache, *sources)
    names = {f.name for f in cached.files}  # type: ignore[attr-defined]
    assert names == {"acme-agent-1.2.3.tgz", "acme_tool-0.4.0-py3-none-any.whl"}
    folder = cached.path  # type: ignore[attr-defined]
    assert sorted(p.name for p in folder.iterdir()) == sorted([*names, "manifest.json"])
    assert not list((tmp_path / "cache" / "tmp").iterdir())  # downloads in progress are gone
    asked = len(registry.requests)
    assert asked > 0

    # The same recipe again, then with no registry at all, then from a copy of the folder elsewhere.
    assert fill(cache, *sources) == cached
    unreachable(monkeypatch)
    assert fill(PackageCache(tmp_path / "cache"), *sources) == cached
    shutil.copytree(tmp_path / "cache", tmp_path / "copied")
    again = fill(PackageCache(tmp_path / "copied"), *sources)
    assert {f.name for f in again.files} == names  # type: ignore[attr-defined]
    assert len(registry.requests) == asked


@pytest.mark.skipif(NPM is None, reason="npm is not installed")
def test_a_tarball_that_does_not_match_the_published_integrity_never_enters_the_cache(
    tmp_path: Path, registry: LocalRegistry
) -> None:
    registry.wrong_hash.add("agent-1.2.3.tgz")
    cache = PackageCache(tmp_path / "cache")
    with pytest.raises(FetchError, match=r"acme/agent@1\.2\.3") as caught:
        fill(cache, NpmPackage("@acme/agent", "1.2.3"))
    assert "integrity" in str(caught.value).lower() or "sha512" in str(caught.value)
    assert not (tmp_path / "cache" / "blobs").exists() or not any((tmp_path / "cache" / "blobs").rglob("*"))
    assert not (tmp_path / "cache" / "index").exists()


def test_a_wheel_that_does_not_match_the_index_hash_is_refused(tmp_path: Path, registry: LocalRegistry) -> None:
    registry.wrong_hash.add("acme_tool-0.4.0-py3-none-any.whl")
    with pytest.raises(FetchError, match="acme"):
        fill(PackageCache(tmp_path / "cache"), PipWheels(("acme-tool==0.4.0",), ("3.11",)))
    assert not (tmp_path / "cache" / "index").exists()


@pytest.mark.skipif(NPM is None, reason="npm is not installed")
def test_a_damaged_cached_file_is_fetched_again_or_named_when_it_cannot_be(
    tmp_path: Path, registry: LocalRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = NpmPackage("@acme/agent", "1.2.3")
    cache = PackageCache(tmp_path / "cache")
    cached = fill(cache, source)
    damaged = cached.path / "acme-agent-1.2.3.tgz"  # type: ignore[attr-defined]
    damaged.chmod(0o644)
    damaged.write_bytes(b"x" * damaged.stat().st_size)  # same size: only the hash can tell

    repaired = fill(PackageCache(tmp_path / "cache"), source)  # a new process: it hashes again
    assert (repaired.path / "acme-agent-1.2.3.tgz").read_bytes() != b"x" * damaged.stat().st_size  # type: ignore[attr-defined]

    broken = repaired.path / "acme-agent-1.2.3.tgz"  # type: ignore[attr-defined]
    broken.chmod(0o644)
    broken.write_bytes(b"truncated")
    unreachable(monkeypatch)
    with pytest.raises(FetchError, match=r"damaged copy .*acme-agent-1\.2\.3\.tgz.*and fetching it again failed"):
        fill(PackageCache(tmp_path / "cache"), source)


def test_the_key_follows_the_recipe() -> None:
    one = cache_key("acme", "1.2.3", [PipWheels(("acme-tool==0.4.0",), ("3.11",))])
    assert one == cache_key("acme", "1.2.3", [PipWheels(("acme-tool==0.4.0",), ("3.11",))])
    assert one != cache_key("acme", "1.2.3", [PipWheels(("acme-tool==0.4.0",), ("3.12",))])
    assert one.startswith("acme-1.2.3-") and "/" not in one


@pytest.mark.skipif(NPM is None, reason="npm is not installed")
def test_an_unknown_version_is_named(tmp_path: Path, registry: LocalRegistry) -> None:
    with pytest.raises(FetchError, match=r"acme/agent@9\.9\.9"):
        fill(PackageCache(tmp_path / "cache"), NpmPackage("@acme/agent", "9.9.9"))


@pytest.mark.skipif(NPM is None, reason="npm is not installed")
def test_an_agent_s_packages_are_fetched_at_once(tmp_path: Path, registry: LocalRegistry) -> None:
    """Gemini CLI needs two npm packages (itself and a Node): they were fetched one after the other."""
    registry.add_npm("node-bin", "22.0.0", npm_tarball({"bin/node": "#!/bin/sh\n"}))
    registry.meet = 2  # each package's metadata is held until both are asked for
    cached = fill(
        PackageCache(tmp_path / "cache"), NpmPackage("@acme/agent", "1.2.3"), NpmPackage("node-bin", "22.0.0")
    )
    assert registry.met, "the second package was asked for only once the first one was fetched"
    assert {f.name for f in cached.files} == {"acme-agent-1.2.3.tgz", "node-bin-22.0.0.tgz"}  # type: ignore[attr-defined]


@pytest.mark.skipif(NPM is None, reason="npm is not installed")
def test_a_damaged_file_is_the_only_one_fetched_again(tmp_path: Path, registry: LocalRegistry) -> None:
    """One altered byte of Node discarded the whole set: the agent's own package was downloaded again too."""
    registry.add_npm("node-bin", "22.0.0", npm_tarball({"bin/node": "#!/bin/sh\n"}))
    sources = (NpmPackage("@acme/agent", "1.2.3"), NpmPackage("node-bin", "22.0.0"))
    cached = fill(PackageCache(tmp_path / "cache"), *sources)
    damaged = cached.path / "node-bin-22.0.0.tgz"  # type: ignore[attr-defined]
    damaged.chmod(0o644)
    data = bytearray(damaged.read_bytes())
    data[-1] ^= 1
    damaged.write_bytes(bytes(data))
    registry.requests.clear()

    repaired = fill(PackageCache(tmp_path / "cache"), *sources)  # a new process: it hashes again
    assert registry.requests and all("node-bin" in path for path in registry.requests), registry.requests
    assert (repaired.path / "node-bin-22.0.0.tgz").read_bytes() != bytes(data)  # type: ignore[attr-defined]
    assert {f.name for f in repaired.files} == {"acme-agent-1.2.3.tgz", "node-bin-22.0.0.tgz"}  # type: ignore[attr-defined]
