"""What the agent CLI tests share: the filled package cache, a registry-less environment, the model scripts.

The five agents' packages (about 600 MB) are fetched from the real npm and
PyPI registries once per machine into the default cache folder
(``~/.cache/pytest-agentcompass/agents``), by the first test session that
needs them (xdist workers take turns through the cache's lock); later
sessions find them there and download nothing. The runs themselves then go
without any registry: npm and pip are pointed at a closed port.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pytest_agentcompass.harnesses.agents.cache import default_cache_dir
from pytest_agentcompass.runtime.registry import AGENT_IDS, Registry

from conftest import docker_has
from model_upstream import Seen, Turn, text, tool

#: Built offline by scripts/build-base-images.sh (glibc and python3: every agent runs on it).
IMAGE = "ubuntu:24.04"
NO_AGENT_DOCKER = f"no Docker engine with {IMAGE} (run scripts/start-docker.sh and scripts/build-base-images.sh)"
#: Harness params the tests give: the test images' python3 is 3.11, so mini-swe-agent fetches that one.
AGENT_PARAMS: dict[str, dict[str, Any]] = {"mini-swe-agent": {"python_versions": ["3.11"]}}
#: The command every agent is made to run: it writes the task's file and shows the agent's environment.
COMMAND = "env > /app/agent-env.txt; printf 'Hello, world!\\n' > /app/hello.txt"
MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def agent_task(root: Path, name: str = "hello-agent", dockerfile_extra: str = "") -> Path:
    """A Harbor task: write /app/hello.txt; its image is ubuntu:24.04 (plus ``dockerfile_extra``)."""
    task = root / name
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "environment" / "Dockerfile").write_text(f"FROM {IMAGE}\n{dockerfile_extra}WORKDIR /app\n")
    (task / "instruction.md").write_text("Create a file /app/hello.txt containing exactly the line `Hello, world!`.\n")
    (task / "task.toml").write_text('version = "1.0"\n[agent]\ntimeout_sec = 300.0\n[verifier]\ntimeout_sec = 60.0\n')
    (task / "tests" / "test.sh").write_text(
        "#!/bin/bash\nmkdir -p /logs/verifier\n"
        'if [ "$(cat /app/hello.txt 2>/dev/null)" = "Hello, world!" ]; then echo 1; else echo 0; fi'
        " > /logs/verifier/reward.txt\n"
    )
    return task


def first_move(agent: str) -> Turn:
    """The tool call each agent's own tool set wants for :data:`COMMAND`."""
    return {
        "claude-code": tool("Bash", {"command": COMMAND, "description": "write the file"}),
        "codex": tool("exec_command", {"cmd": COMMAND}),
        "gemini-cli": tool("run_shell_command", {"command": COMMAND}),
        "opencode": tool("bash", {"command": COMMAND, "description": "write the file"}),
        "mini-swe-agent": tool("bash", {"command": COMMAND}),
    }[agent]


def responder_for(agent_of_model: Callable[[str | None], str]) -> Callable[[Seen], Turn]:
    """Plays the model for every agent: the tool call first, then the end of the task in its way."""

    def respond(seen: Seen) -> Turn:
        agent = agent_of_model(seen.model)
        if agent == "mini-swe-agent":  # every turn a tool call; the marker ends it
            return first_move(agent) if seen.tool_results() == 0 else tool("bash", {"command": f"echo {MARKER}"})
        if not seen.tools():  # a side request (opencode's title)
            return text("Write hello.txt")
        return first_move(agent) if seen.tool_results() == 0 else text("Done: /app/hello.txt is written.")

    return respond


def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No package registry answers (a closed port): what the runs fetch must come from the cache."""
    monkeypatch.setenv("npm_config_registry", "http://127.0.0.1:9/")
    monkeypatch.setenv("npm_config_fetch_retries", "0")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple/")
    monkeypatch.setenv("PIP_RETRIES", "0")


def fill_agent_cache() -> Path:
    """The five agents' packages in the default cache: fetched from the registries by the first session
    (a session fixture of the tests calls it)."""
    if shutil.which("npm") is None:
        if os.environ.get("CI"):
            pytest.fail("npm is not installed: .ci/run installs it (the agent CLIs are fetched with it)")
        pytest.skip("npm is not installed")
    if not docker_has(IMAGE):
        if os.environ.get("CI"):
            pytest.fail(NO_AGENT_DOCKER)
        pytest.skip(NO_AGENT_DOCKER)
    registry = Registry(Path.cwd())

    async def fill() -> None:
        for agent in AGENT_IDS:
            await registry.resolve("harness", agent)(**AGENT_PARAMS.get(agent, {})).recipe()

    asyncio.run(fill())
    return default_cache_dir()
