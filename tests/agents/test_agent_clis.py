"""The built-in agent CLIs, for real: each installed from the cache into a Docker image once, run
headless on a Harbor task with ``network.run: disabled``, talking to a scripted upstream through the
model gateway. No registry is reachable during the runs; the upstream's key never enters a container.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_agentcompass.runtime.registry import AGENT_IDS

from agent_scripts import AGENT_PARAMS, agent_task, fill_agent_cache, offline, responder_for
from conftest import write_config
from containers import changed_files, docker
from model_upstream import ScriptedServer, scripted_server

pytest.importorskip("aiohttp")
pytest.importorskip("docker")

KEY = "sk-agents-upstream-key-5e1f0c93b7"
RUN = ("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider")


@pytest.fixture(scope="session")
def agent_packages() -> Path:
    return fill_agent_cache()


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[ScriptedServer]:
    """The upstream, answering for every agent (one model name per agent), accepting only :data:`KEY`."""
    monkeypatch.setenv("AGENTS_UPSTREAM_KEY", KEY)
    with scripted_server(responder=responder_for(lambda model: str(model).removeprefix("model-")), api_key=KEY) as up:
        yield up


def request(agent: str, server: ScriptedServer, cache: Path, **execution: Any) -> dict[str, Any]:
    """A request of ``agent`` on the tasks under ``tasks/`` (the cache named: pytester's HOME is its own)."""
    return {
        "name": agent,
        "benchmark": {"id": "harbor", "params": {"path": "tasks"}},
        "harness": {"id": agent, "params": {"cache_dir": str(cache), **AGENT_PARAMS.get(agent, {})}},
        "environment": {"id": "docker", "network": {"run": "disabled"}},
        "model": {
            "id": f"model-{agent}",
            "params": {
                "base_url": server.base_url,
                "anthropic_base_url": server.root_url,
                "gemini_base_url": server.root_url,
                "api_key": "${AGENTS_UPSTREAM_KEY}",
            },
        },
        "execution": {"retry_backoff_seconds": 0, **execution},
    }


def details(root: Path, agent: str) -> list[dict[str, Any]]:
    """The task details of ``agent``'s newest run."""
    run = max((root / "runs" / agent).iterdir())
    return [json.loads(p.read_text()) for p in sorted((run / "details").glob("*.json"))]


def counted(server: ScriptedServer, model: str) -> dict[str, int]:
    """What the upstream served and reported for the calls made for ``model`` (every call it was
    sent counts, an error answer's too)."""
    totals = dict.fromkeys(("calls", "prompt_tokens", "completion_tokens", "total_tokens"), 0)
    for call in server.requests:
        body, usage = call["body"], call["usage"]
        named = body.get("model") if isinstance(body, dict) else None
        if model not in (named or call["path"]):
            continue
        totals["calls"] += 1
        if usage is None:
            continue
        for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
            totals[key] += usage[key]
    return totals


def written_anywhere(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in root.rglob("*") if p.is_file())


def test_each_agent_cli_solves_a_harbor_task_through_the_gateway_without_the_key(
    pytester: pytest.Pytester, agent_packages: Path, server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent_task(pytester.path / "tasks")
    write_config(
        pytester, [request(a, server, agent_packages, keep_environment=True) for a in AGENT_IDS], task_concurrency=5
    )
    offline(monkeypatch)
    result = pytester.runpytest(*RUN, "--junitxml=junit.xml")
    kept = {
        agent: docker(
            "ps",
            "-aq",
            "--filter",
            f"label=agentcompass.request={agent}",
            "--filter",
            f"label=agentcompass.run={_run_id(pytester, agent)}",
        ).split()
        for agent in AGENT_IDS
    }
    try:
        contents = {agent: {k: v for c in ids for k, v in changed_files(c).items()} for agent, ids in kept.items()}
    finally:
        for ids in kept.values():
            for container in ids:
                docker("rm", "-f", container)
    result.assert_outcomes(passed=len(AGENT_IDS))
    for agent in AGENT_IDS:
        (record,) = details(pytester.path, agent)
        metadata = record["metadata"]
        assert record["score"] == 1.0, (agent, record["error"])
        # The gateway counted every call the agent made, and the upstream agrees.
        assert metadata["usage"] == counted(server, f"model-{agent}"), agent
        assert metadata["usage"]["calls"] >= 2, agent
        assert metadata["agent"]["exit_code"] == 0 and metadata["agent"]["version"], agent
        assert metadata["agent_install"]["image"].startswith("agentcompass-agent:"), agent
        assert record["artifacts"]["trajectory"].endswith("trajectory.json"), agent
        # The agent ran the tool call: its shell had the attempt's token, never the key.
        environment = contents[agent]["/app/agent-env.txt"].decode()
        assert "agc-" in environment, agent
        assert not [path for path, data in contents[agent].items() if KEY.encode() in data], agent
    assert KEY.encode() not in written_anywhere(pytester.path)  # run directories and junit.xml


def _run_id(pytester: pytest.Pytester, agent: str) -> str:
    return max((pytester.path / "runs" / agent).iterdir()).name


@pytest.fixture
def fresh_image() -> Iterator[str]:
    """A Dockerfile line that gives the task an image of its own (so its agent install happens here);
    that image and what was derived from it are removed afterwards."""
    nonce = uuid.uuid4().hex[:12]
    yield f'LABEL agentcompass.test-nonce="{nonce}"\n'
    for image in docker("images", "-q", "--filter", f"label=agentcompass.test-nonce={nonce}").split():
        for derived in docker("images", "-q", "--filter", f"label=agentcompass.base-image={_id(image)}").split():
            docker("rmi", "-f", derived)
        docker("rmi", "-f", image)


def _id(image: str) -> str:
    return docker("image", "inspect", image, "--format", "{{.Id}}")


def test_tasks_on_two_workers_install_the_agent_once_and_the_next_run_installs_nothing(
    pytester: pytest.Pytester,
    agent_packages: Path,
    server: ScriptedServer,
    monkeypatch: pytest.MonkeyPatch,
    fresh_image: str,
) -> None:
    """Four tasks on a new image, two per worker, all four holding a permit at once (``task_concurrency``
    is run-wide): two installs wanted in each worker while neither has the image, and one install
    serves them all; a later run finds it and installs nothing."""
    for index in range(4):
        agent_task(pytester.path / "tasks", f"hello-{index}", fresh_image)
    write_config(pytester, [request("claude-code", server, agent_packages)], task_concurrency=4)
    offline(monkeypatch)
    result = pytester.runpytest(*RUN, "-n", "2", "-v")
    result.assert_outcomes(passed=4)
    ran_on = {line.split()[0] for line in result.outlines if line.startswith("[gw") and "PASSED" in line}
    assert ran_on == {"[gw0]", "[gw1]"}  # both workers ran tasks
    first = details(pytester.path, "claude-code")
    installs = [d for d in first if d["metadata"]["agent_install"]["installed"]]
    assert len(installs) == 1
    (made,) = installs
    run = pytester.path / "runs" / "claude-code" / _run_id(pytester, "claude-code")
    assert (
        "Claude Code" in (run / made["metadata"]["agent_install"]["log"]).read_text()
    )  # the install ran the agent once to prove it starts
    assert {d["metadata"]["agent_install"]["image"] for d in first} == {made["metadata"]["agent_install"]["image"]}
    assert docker("ps", "-aq", "--filter", "label=agentcompass.purpose=agent-install", "--filter",
                  f"label=agentcompass.run={run.name}") == ""  # fmt: skip

    pytester.runpytest(*RUN, "--agentcompass-new-run", "-k", "hello-0").assert_outcomes(passed=1)
    assert not [d for d in details(pytester.path, "claude-code") if d["metadata"]["agent_install"]["installed"]]


def test_codex_leaves_nothing_running_for_a_shared_verifier(
    pytester: pytest.Pytester,
    agent_packages: Path,
    server: ScriptedServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """codex 0.171 syncs its curated plugins with ``git ls-remote`` in the background unless the
    harness's config.toml turns plugins off. The task's git never answers (as one reaching for
    github.com through a network that drops it), so a sync would still run when the verifier starts.

    The task's image and codex's install into it stay in the engine, as the other tasks' do: a later
    session finds them (the install itself is the business of the test above)."""
    stuck_git = "RUN printf '#!/bin/sh\\nsleep 600\\n' > /usr/bin/git && chmod +x /usr/bin/git\n"
    agent_task(pytester.path / "tasks", dockerfile_extra=stuck_git)
    write_config(pytester, [request("codex", server, agent_packages, integrity="strict")])
    offline(monkeypatch)
    pytester.runpytest(*RUN).assert_outcomes(passed=1)
    (record,) = details(pytester.path, "codex")
    assert record["score"] == 1.0 and not record["metadata"].get("integrity"), record
