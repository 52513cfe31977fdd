"""``python -m pytest_agentcompass agents fetch``: the cache filled ahead (as .ci/run does), then used offline;
an unreachable or silent registry fails at once, naming the agent, the package and the registry."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_agentcompass.harnesses.agents import ClaudeCodeHarness, OpenCodeHarness
from pytest_agentcompass.harnesses.agents.cache import PackageCache, ensure_packages

from registries import LocalRegistry, local_registry, npm_tarball

pytestmark = pytest.mark.skipif(shutil.which("npm") is None, reason="npm is not installed")


def agents(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "pytest_agentcompass", "agents", *args]
    # The backstop only ends a run that hangs (npm's own defaults wait minutes for a silent registry).
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=240, check=False)


@pytest.fixture
def npm_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.lower().startswith("npm_config_")}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    env["npm_config_cache"] = str(tmp_path / "npm-cache")
    return env


@pytest.fixture
def registry() -> Iterator[LocalRegistry]:
    """Claude Code's and OpenCode's packages at their pinned versions (a stand-in tarball each)."""
    with local_registry() as served:
        for harness, name in (
            (ClaudeCodeHarness, "@anthropic-ai/claude-code-linux-x64"),
            (OpenCodeHarness, "opencode-linux-x64"),
        ):
            served.add_npm(name, harness.version, npm_tarball({"bin/agent": "#!/bin/sh\n"}))
        yield served


def test_fetch_fills_the_cache_that_a_run_then_finds_without_a_registry(
    tmp_path: Path, registry: LocalRegistry, npm_env: dict[str, str]
) -> None:
    cache = tmp_path / "agents"
    done = agents(
        "fetch",
        "claude-code",
        "opencode",
        "--cache-dir",
        str(cache),
        env={**npm_env, "npm_config_registry": registry.npm_url},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = sorted(done.stdout.splitlines())
    assert lines[0].startswith(f"claude-code {ClaudeCodeHarness.version}: cached in {cache}/sets/"), lines
    assert lines[1].startswith(f"opencode {OpenCodeHarness.version}: cached in {cache}/sets/"), lines
    # What a run asks for, with no registry at all: found.
    harness = ClaudeCodeHarness()
    found = asyncio.run(
        ensure_packages(PackageCache(cache), harness.id, harness.version, harness.packages(harness.version))
    )
    assert [f.name for f in found.files] == [f"anthropic-ai-claude-code-linux-x64-{harness.version}.tgz"]
    again = agents(
        "fetch", "claude-code", "--cache-dir", str(cache), env={**npm_env, "npm_config_registry": "http://127.0.0.1:9/"}
    )
    assert again.returncode == 0, again.stdout + again.stderr  # cached: no registry asked


def test_an_unknown_agent_is_named(tmp_path: Path, npm_env: dict[str, str]) -> None:
    done = agents("fetch", "claud", "--cache-dir", str(tmp_path), env=npm_env)
    assert done.returncode == 2 and "unknown agent 'claud': the built-in agents are claude-code, codex" in done.stderr


@pytest.fixture
def silent_registry() -> Iterator[tuple[str, list[socket.socket]]]:
    """A registry that takes connections and never answers."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)  # a close does not wake a thread blocked in accept(): it looks again
    taken: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            try:
                taken.append(server.accept()[0])
            except TimeoutError:
                continue
            except OSError:
                return

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}/", taken
    finally:
        done.set()
        thread.join()
        server.close()
        for connection in taken:
            connection.close()


def test_a_silent_registry_fails_the_fetch_at_once_naming_the_agent_the_package_and_the_registry(
    tmp_path: Path, npm_env: dict[str, str], silent_registry: tuple[str, list[socket.socket]]
) -> None:
    """npm's own defaults (five minutes a try, three tries) kept an empty cache waiting for a quarter of an hour."""
    url, taken = silent_registry
    done = agents("fetch", "claude-code", "--cache-dir", str(tmp_path), env={**npm_env, "npm_config_registry": url})
    assert done.returncode == 1, done.stdout + done.stderr
    (line, *rest) = done.stdout.splitlines()
    package = f"@anthropic-ai/claude-code-linux-x64@{ClaudeCodeHarness.version}"
    said = f"npm package {package} from the registry {url}: `npm view {package} dist --json` failed (exit 1)"
    assert line == f"claude-code {ClaudeCodeHarness.version}: not fetched: {said} to look up {package}:", done.stdout
    assert len(taken) <= 2 and len(rest) <= 6, done.stdout  # one retry, a few telling lines
    assert "complete log" not in done.stdout
