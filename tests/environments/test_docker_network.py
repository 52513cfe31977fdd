"""What the docker provider asks of the engine per attempt, read back from the engine itself.

The container's network settings must follow the plan (no network at all when the
baseline is ``disabled``, the bridge only while a phase needs it), and an open makes
no exec of its own (the engine creates the workdir). Checked with ``docker inspect``,
the engine's event log and what the container sees, never with mocks.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from test_docker import IMAGE, containers, leftovers

from pytest_agentcompass import EnvironmentSpec
from pytest_agentcompass.environments.conformance import make_plan
from pytest_agentcompass.environments.docker import DockerEnvironment, DockerSession

from conftest import write_config

pytestmark = pytest.mark.usefixtures("no_leftovers")


@pytest.fixture
def mark() -> str:
    return uuid.uuid4().hex


@pytest.fixture
def no_leftovers(mark: str) -> Any:
    yield
    assert containers(f"agentcompass.test={mark}") == []


def inspect(container_id: str) -> dict[str, Any]:
    out = subprocess.run(["docker", "inspect", container_id], capture_output=True, text=True, check=True).stdout
    return json.loads(out)[0]  # type: ignore[no-any-return]


def networks(container_id: str) -> dict[str, Any]:
    return inspect(container_id)["NetworkSettings"]["Networks"] or {}


FORMAT = '{{.Type}} {{.Action}} {{index .Actor.Attributes "container"}} {{.Actor.Attributes.name}}'


def events(container_id: str, since: float) -> list[str]:
    """The engine's log of what was done to the container since ``since``: ``type action [network]``.

    Network events name the container in an attribute, not as their actor, so they are filtered here.
    """
    until = time.time() + 1
    window = ["--since", f"{since:.3f}", "--until", f"{until:.3f}"]
    found = []
    for selector in ([f"container={container_id}"], ["type=network"]):
        out = subprocess.run(
            ["docker", "events", *window, "--filter", selector[0], "--format", FORMAT],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for line in out.splitlines():
            kind, action, container, name = [*line.split(), "", ""][:4]
            if kind == "container":
                found.append(f"container {action}")
            elif container == container_id:
                found.append(f"network {action} {name}")
    return found


def bridge_events(container_id: str, since: float) -> list[str]:
    """Connects and disconnects of the bridge, in order (this engine logs a disconnect twice: once here)."""
    bridge = [e for e in events(container_id, since) if e.startswith("network") and e.endswith(" bridge")]
    return [event for event, _ in itertools.groupby(bridge)]


async def interfaces(session: DockerSession) -> list[str]:
    result = await session.exec(["ls", "/sys/class/net"])
    assert result.exit_code == 0, result.stderr
    return sorted(result.stdout.split())


def opened(mark: str, plan: Any, **params: Any) -> tuple[DockerEnvironment, Any]:
    provider = DockerEnvironment(EnvironmentSpec(id="docker", params={"image": IMAGE, **params}))
    return provider, provider.build_config(plan, "task", {"agentcompass.test": mark})


def test_an_all_disabled_plan_gets_no_network_and_no_exec_on_open(mark: str) -> None:
    provider, config = opened(mark, make_plan("disabled", "disabled", "disabled"), workdir="/deep/er/work")
    since = time.time() - 1

    async def scenario() -> None:
        session = await provider.open(config)
        assert isinstance(session, DockerSession)
        try:
            cid = session.container.id
            state = inspect(cid)
            assert state["HostConfig"]["NetworkMode"] == "none"
            assert set(networks(cid)) == {"none"}
            assert [e for e in events(cid, since) if e.startswith("container exec")] == []  # open made none
            assert await interfaces(session) == ["lo"]
            where = await session.exec(["sh", "-c", 'pwd; grep -c "$(hostname)" /etc/hosts'])
            assert where.stdout.split() == ["/deep/er/work", "1"]  # the engine made the workdir
            assert session.network_policy == "disabled"
        finally:
            await session.close()
            await provider.aclose()  # its keepalive volume too
        assert bridge_events(cid, since) == []  # never attached

    asyncio.run(scenario())


def test_a_network_phase_attaches_the_bridge_and_the_next_detaches_it(mark: str) -> None:
    provider, config = opened(mark, make_plan("disabled", "full", "disabled"))
    since = time.time() - 1

    async def scenario() -> None:
        session = await provider.open(config)
        assert isinstance(session, DockerSession)
        try:
            cid = session.container.id
            assert inspect(cid)["HostConfig"]["NetworkMode"] == "none"
            assert await interfaces(session) == ["lo"]
            for _ in range(2):  # attached, detached, and once more: the second attach has no "none" to leave
                await session.set_network_policy("full")
                bridge = networks(cid)["bridge"]
                assert set(networks(cid)) == {"bridge"} and bridge["IPAddress"]
                assert len(await interfaces(session)) == 2  # lo and the bridge's interface
                gateway = await session.exec(["ping", "-c", "1", "-W", "5", bridge["Gateway"]])
                assert gateway.exit_code == 0, gateway.stdout + gateway.stderr
                hosts = await session.exec(["cat", "/etc/hosts"])
                assert bridge["IPAddress"] in hosts.stdout
                await session.set_network_policy("disabled")
                assert networks(cid) == {}
                assert await interfaces(session) == ["lo"]
        finally:
            await session.close()
            await provider.aclose()  # its keepalive volume too
        assert bridge_events(cid, since) == ["network connect bridge", "network disconnect bridge"] * 2

    asyncio.run(scenario())


def test_a_full_baseline_starts_on_the_bridge(mark: str) -> None:
    provider, config = opened(mark, make_plan("full", "disabled", "full"))

    async def scenario() -> None:
        session = await provider.open(config)
        assert isinstance(session, DockerSession)
        try:
            cid = session.container.id
            assert inspect(cid)["HostConfig"]["NetworkMode"] == "bridge"
            assert set(networks(cid)) == {"bridge"}
            await session.set_network_policy("disabled")
            assert networks(cid) == {} and await interfaces(session) == ["lo"]
            await session.set_network_policy("full")
            assert set(networks(cid)) == {"bridge"} and len(await interfaces(session)) == 2
        finally:
            await session.close()
            await provider.aclose()  # its keepalive volume too

    asyncio.run(scenario())


PHASES = """
import dataclasses, json, subprocess
from pytest_agentcompass import HarnessFreeBenchmark, RunResult, TaskSpec

def seen(env):
    out = subprocess.run(["docker", "inspect", env.container.id], capture_output=True, check=True).stdout
    inspected = json.loads(out)
    return {"mode": inspected[0]["HostConfig"]["NetworkMode"],
            "networks": sorted(inspected[0]["NetworkSettings"]["Networks"] or {})}

class Phases(HarnessFreeBenchmark):
    evaluation_environment_mode = "reuse"
    def load_tasks(self, req):
        return [TaskSpec("t0"), TaskSpec("t1")]
    def prepare_task(self, task, env, req, plan):
        self.record(task, "prepare", env)
        return super().prepare_task(task, env, req, plan)
    async def run_task(self, task, prepared, env, req, plan):
        self.record(task, "run", env)
        return RunResult(task.task_id, output="ok")
    def evaluate(self, task, prepared, result, req, plan, env=None):
        self.record(task, "evaluate", env)
        return dataclasses.replace(result, score=1.0)
    def record(self, task, phase, env):
        with open(f"phases-{task.task_id}.jsonl", "a") as out:
            out.write(json.dumps({"phase": phase, "id": env.container.id, **seen(env)}) + "\\n")
"""


@pytest.mark.parametrize("run", ["full", "disabled"])
def test_each_phase_of_a_run_sees_its_plans_network(pytester: pytest.Pytester, run: str) -> None:
    pytester.makepyfile(phases=PHASES)
    network = {"baseline": "disabled", "run": run, "evaluation": "disabled"}
    environment = {"id": "docker", "params": {"image": IMAGE}, "network": network}
    write_config(pytester, [{"name": "d", "benchmark": {"id": "phases.py:Phases"}, "environment": environment}])
    result = pytester.runpytest("--agentcompass=agentcompass.yaml", "--agentcompass-progress=off")
    result.assert_outcomes(passed=2)
    (run_dir,) = (pytester.path / "runs/d").iterdir()
    assert leftovers(f"agentcompass.run={run_dir.name}") == []
    for task in ("t0", "t1"):
        lines = [json.loads(line) for line in Path(pytester.path / f"phases-{task}.jsonl").read_text().splitlines()]
        assert [line["phase"] for line in lines] == ["prepare", "run", "evaluate"]
        assert len({line["id"] for line in lines}) == 1  # one container, reused for the evaluation
        assert all(line["mode"] == "none" for line in lines)  # created with no network
        expected = [["none"], ["bridge"], []] if run == "full" else [["none"]] * 3  # attached, then detached
        assert [line["networks"] for line in lines] == expected
