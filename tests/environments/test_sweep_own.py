"""A run whose cleanups overran the grace removes what this process left open, not what another
process of the same run (an xdist worker, which shares the run's id) is still running.

Two real processes, each with a command in flight in a local workspace and a container on the
engine, both of one run: ``sweep_own`` in one leaves the other's alone; ``sweep`` (the start of a
resumed run, when every process of the killed run is gone) removes both.
"""

from __future__ import annotations

import asyncio
import os
import select
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from pytest_agentcompass import EnvironmentSpec
from pytest_agentcompass.environments.conformance import make_plan
from pytest_agentcompass.environments.local import LocalEnvironment
from pytest_agentcompass.environments.markers import (
    PROCESS_LABEL,
    PROCESS_MARKER,
    find_marked,
    kill_marked,
    this_process,
)

from containers import docker

IMAGE = "agentcompass-busybox:test"

#: The other process: a command in flight in a workspace, a container, then it waits for its stdin to close.
OTHER = textwrap.dedent(
    """
    import asyncio, sys
    from pytest_agentcompass import EnvironmentSpec
    from pytest_agentcompass.environments.conformance import make_plan
    from pytest_agentcompass.environments.local import LocalEnvironment
    from pytest_agentcompass.environments.markers import PROCESS_LABEL, PROCESS_MARKER, find_marked, this_process

    async def main():
        run, base, image = sys.argv[1:4]
        labels = {"agentcompass.run": run, PROCESS_LABEL: this_process()}
        local = LocalEnvironment(EnvironmentSpec(params={"base_dir": base}))
        session = await local.open(local.build_config(make_plan(), "task", labels))
        running = asyncio.ensure_future(session.exec(["sleep", "300"]))
        providers = [local]
        if image:
            from pytest_agentcompass.environments.docker import DockerEnvironment

            docker = DockerEnvironment(EnvironmentSpec(id="docker", params={"image": image}))
            providers.append(docker)
            container = await docker.open(docker.build_config(make_plan(), "task", labels))
            await docker.host_route(container)  # the model gateway's network
        for _ in range(400):  # until the command runs (found in /proc by its marker)
            if find_marked(f"{run}/{this_process()}", PROCESS_MARKER):
                break
            await asyncio.sleep(0.05)
        print(this_process(), flush=True)
        await asyncio.to_thread(sys.stdin.read)
        running.cancel()
        for provider in providers:
            await provider.aclose()

    asyncio.run(main())
    """
)


def _engine() -> bool:
    probe = subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True, check=False)
    return probe.returncode == 0


def _marked(value: str) -> list[int]:
    """The live processes whose environment holds ``AGENTCOMPASS_PROCESS=<value>``."""
    return find_marked(value, PROCESS_MARKER)


async def _started(value: str) -> None:
    """Wait (up to 20 s) until a command marked ``value`` runs."""
    for _ in range(400):
        if _marked(value):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"no command marked {value} started")


def _gateway_networks(run: str) -> list[str]:
    return docker("network", "ls", "-q", "--filter", f"label=agentcompass.run={run}").split()


def _containers(run: str, process: str) -> list[str]:
    mine = ("--filter", f"label={PROCESS_LABEL}={process}")
    return docker("ps", "-aq", "--filter", f"label=agentcompass.run={run}", *mine).split()


@pytest.mark.parametrize("with_docker", [False, True], ids=["local", "local-and-docker"])
def test_sweep_own_leaves_the_other_processes_of_the_run_alone(tmp_path: Path, with_docker: bool) -> None:
    if with_docker and not _engine():
        if os.environ.get("CI"):
            pytest.fail("CI must start the Docker engine first: bash scripts/start-docker.sh")
        pytest.skip("no Docker engine with the test image (run scripts/start-docker.sh)")
    run = f"own-{uuid.uuid4().hex[:8]}"
    image = IMAGE if with_docker else ""
    other = subprocess.Popen(
        [sys.executable, "-c", OTHER, run, str(tmp_path), image],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[1],
    )
    local = LocalEnvironment(EnvironmentSpec(params={"base_dir": str(tmp_path)}))
    providers: list[object] = [local]
    mine = this_process()
    try:
        assert other.stdout is not None
        ready, _, _ = select.select([other.stdout], [], [], 60)
        assert ready, "the other process did not start its command within 60 s"
        theirs = other.stdout.readline().strip()
        assert theirs and theirs != mine, theirs

        async def scenario() -> None:
            labels = {"agentcompass.run": run}  # the providers add this process's name themselves
            session = await local.open(local.build_config(make_plan(), "task", labels))
            running = asyncio.ensure_future(session.exec(["sleep", "300"]))
            if with_docker:
                from pytest_agentcompass.environments.docker import DockerEnvironment

                engine = DockerEnvironment(EnvironmentSpec(id="docker", params={"image": IMAGE}))
                providers.append(engine)
                container = await engine.open(engine.build_config(make_plan(), "task", labels))
                await engine.host_route(container)  # the model gateway's network, this provider's
                assert len(_gateway_networks(run)) == 2
            await _started(f"{run}/{mine}")
            assert _marked(f"{run}/{theirs}")
            assert len(list(tmp_path.glob(f"agentcompass-{run}-*"))) == 2

            # A cleanup that overran the grace: what this process left goes, the other's stays.
            removed = await (engine.sweep_own(run) if with_docker else local.sweep_own(run))
            removed += await local.sweep_own(run) if with_docker else 0
            assert removed >= 2 + (1 if with_docker else 0)
            assert _marked(f"{run}/{mine}") == []
            assert _marked(f"{run}/{theirs}"), "the other process's command was killed"
            (left,) = tmp_path.glob(f"agentcompass-{run}-*")
            assert f"-{theirs}-" in left.name, left
            if with_docker:
                assert _containers(run, mine) == []
                assert len(_containers(run, theirs)) == 1, "the other process's container was removed"
                volumes = docker("volume", "ls", "-q", "--filter", f"label=agentcompass.run={run}").split()
                assert len(volumes) == 1, volumes  # the other process's keepalive volume, in use
                assert len(_gateway_networks(run)) == 1  # the other process's: its container is on it
            await asyncio.wait({running}, timeout=10)
            assert running.done()  # its command was killed: the exec ended

            # The start of a resumed run (the other processes are gone): everything of the run.
            await local.sweep(run)
            assert _marked(f"{run}/{theirs}") == []
            assert list(tmp_path.glob(f"agentcompass-{run}-*")) == []
            if with_docker:
                await engine.sweep(run)
                assert _containers(run, theirs) == []
                assert _gateway_networks(run) == []
            for provider in providers:
                await provider.aclose()  # type: ignore[attr-defined]

        asyncio.run(scenario())
    finally:
        assert other.stdin is not None
        other.stdin.close()
        try:
            other.wait(timeout=60)
        finally:
            other.kill()
            kill_marked(run)
            if with_docker:  # what a failed assertion above left, by the run's id (the product's own sweep)
                asyncio.run(_sweep_run(run))
    if with_docker:
        assert docker("ps", "-aq", "--filter", f"label=agentcompass.run={run}").split() == []
        assert docker("volume", "ls", "-q", "--filter", f"label=agentcompass.run={run}").split() == []
        assert _gateway_networks(run) == []


async def _sweep_run(run: str) -> None:
    from pytest_agentcompass.environments.docker import DockerEnvironment

    provider = DockerEnvironment(EnvironmentSpec(id="docker", params={"image": IMAGE}))
    try:
        await provider.sweep(run)
    finally:
        await provider.aclose()
