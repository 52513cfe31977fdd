"""What keeps a docker container up is the runner's own program, on the real engine: an image
with no ``sleep`` and no shell runs tasks, and a ``sleep`` the agent replaced never runs."""

from __future__ import annotations

import dataclasses
import io
import platform
import posixpath
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
import requests
from test_docker import IMAGE, leftovers
from test_docker_trusted import scenario

from pytest_agentcompass.environments.conformance import make_plan
from pytest_agentcompass.environments.docker import DockerEnvironment
from pytest_agentcompass.environments.docker_keepalive import KEEPALIVE_PREFIX, program

from conftest import write_config


@pytest.fixture(scope="module")
def bare_image() -> Iterator[str]:
    """An image with one static program (busybox, under a path no tool looks in): no ``/bin/sleep``,
    no ``sh``, nothing on ``PATH``."""
    tag = f"agentcompass-bare:{uuid.uuid4().hex[:12]}"
    dockerfile = f"FROM {IMAGE} AS tools\nFROM scratch\nCOPY --from=tools /bin/busybox /opt/box/busybox\n"
    client = docker.from_env()
    client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True, labels={"agentcompass.test": "1"})
    try:
        yield tag
    finally:
        client.images.remove(tag, force=True)
        client.close()


async def _keepalive_args(session: Any) -> list[str]:
    """The command lines of the runner's own processes in ``session`` (its init and keepalive)."""
    return [p.args for p in await session.processes() if p.pid in session.runner_pids]


def test_an_image_without_sleep_or_shell_runs_the_container_and_its_commands(bare_image: str) -> None:
    async def body(provider: DockerEnvironment, session: Any, run_id: str) -> None:
        done = await session.exec(["/opt/box/busybox", "echo", "from the image"])
        assert (done.exit_code, done.stdout) == (0, "from the image\n")
        await session.write_text("answer.txt", "42")
        assert await session.read_text("answer.txt") == "42"
        own = await _keepalive_args(session)
        assert len(own) == 2 and any(KEEPALIVE_PREFIX in a for a in own), own
        # The runner's program is not a change the agent made.
        changed = {c.path for c in await session.changes()}
        assert "/work/answer.txt" in changed and not any(p.startswith(KEEPALIVE_PREFIX) for p in changed), changed
        # A snapshot of it starts too (kept up by a program of its own, at another path).
        await session.snapshot()
        plan = dataclasses.replace(make_plan(mode="fresh"), environment={"evaluation": {"from_snapshot": True}})
        evaluation = await provider.open(provider.build_config(plan, "evaluation", {"agentcompass.run": run_id}))
        try:
            assert await evaluation.read_text("answer.txt") == "42"
            assert evaluation.keepalive != session.keepalive
            assert any(a == evaluation.keepalive for a in await _keepalive_args(evaluation))
        finally:
            await evaluation.close()

    scenario({"record_pids": True}, body, bare_image)


BARE = """
import dataclasses
from pytest_agentcompass import HarnessFreeBenchmark, RunResult, TaskSpec

class Count(HarnessFreeBenchmark):
    def load_tasks(self, req):
        return [TaskSpec(f"t{i}", ground_truth=f"t{i}") for i in range(3)]
    async def run_task(self, task, prepared, env, req, plan):
        done = await env.exec(["/opt/box/busybox", "echo", task.task_id])
        assert done.exit_code == 0, done.stderr
        await env.write_text("answer.txt", done.stdout.strip())
        return RunResult(task.task_id, output=done.stdout.strip())
    def evaluate(self, task, prepared, result, req, plan, env=None):
        return dataclasses.replace(result, score=float(result.output == task.ground_truth))
"""


def test_tasks_run_on_an_image_without_sleep_or_shell(pytester: pytest.Pytester, bare_image: str) -> None:
    pytester.makepyfile(bare=BARE)
    environment = {"id": "docker", "params": {"image": bare_image}}
    write_config(pytester, [{"name": "d", "benchmark": {"id": "bare.py:Count"}, "environment": environment}])
    result = pytester.runpytest("--agentcompass=agentcompass.yaml", "--agentcompass-progress=off")
    result.assert_outcomes(passed=3)
    (run_dir,) = (pytester.path / "runs/d").iterdir()
    assert leftovers(f"agentcompass.run={run_dir.name}") == []


def test_a_sleep_the_agent_replaced_never_runs_as_the_keepalive() -> None:
    async def body(provider: DockerEnvironment, session: Any, run_id: str) -> None:
        # The agent's own /bin/sleep: it would leave a mark, then sleep as asked.
        script = '#!/bin/sh\\necho ran > /work/sleep-ran\\nexec /bin/busybox sleep "$@"\\n'
        done = await session.exec(
            ["sh", "-c", f"rm /bin/sleep && printf '{script}' > /bin/sleep && chmod 755 /bin/sleep"], user="0"
        )
        assert done.exit_code == 0, done.stderr
        await session.snapshot()
        plan = dataclasses.replace(make_plan(mode="fresh"), environment={"evaluation": {"from_snapshot": True}})
        evaluation = await provider.open(provider.build_config(plan, "evaluation", {"agentcompass.run": run_id}))
        try:
            assert await evaluation.stat("/work/sleep-ran") is None
            own = await _keepalive_args(evaluation)
            assert evaluation.keepalive in own and not any("sleep" in a for a in own), own
            assert await evaluation.stat("/bin/sleep") is not None  # the agent's file is there, never run
        finally:
            await evaluation.close()

    scenario({"record_pids": True}, body)


def test_the_keepalive_ends_with_a_stop_like_sleep_did(bare_image: str) -> None:
    async def body(provider: DockerEnvironment, session: Any, run_id: str) -> int:
        stopped = subprocess.run(["docker", "stop", "-t", "30", session.container.id], capture_output=True, check=True)
        assert stopped.returncode == 0
        return int(session.container.client.api.inspect_container(session.container.id)["State"]["ExitCode"])

    # SIGTERM ends it at once (the default action: it has no handler), not the SIGKILL after 30 s.
    assert scenario({}, body, bare_image) == 143


class _Requests:
    """Counts the engine requests a provider makes of some kinds (each still made, on the real engine)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.installs: list[str] = []  # archive writes at "/": a keepalive or folders written into a container
        self.volume_writes: list[str] = []
        self.tops = 0
        api = docker.api.client.APIClient
        put, top = api.put_archive, api.top

        def put_archive(client: Any, container: str, path: str, data: bytes) -> bool:
            (self.installs if path == "/" else self.volume_writes).append(path)
            return bool(put(client, container, path, data))

        def counted_top(client: Any, *args: Any, **kwargs: Any) -> Any:
            self.tops += 1
            return top(client, *args, **kwargs)

        monkeypatch.setattr(api, "put_archive", put_archive)
        monkeypatch.setattr(api, "top", counted_top)


def _md5(data: bytes) -> str:
    import hashlib

    return hashlib.md5(data).hexdigest()


def test_every_container_runs_the_keepalive_from_one_read_only_volume(monkeypatch: pytest.MonkeyPatch) -> None:
    """The program is written once per engine (a volume), not into each container; a container can
    neither change nor remove it for the others; the volume goes with the provider (``scenario``
    checks no volume of the run is left)."""
    requests = _Requests(monkeypatch)

    async def body(provider: DockerEnvironment, session: Any, run_id: str) -> None:
        other = await provider.open(provider.build_config(make_plan(), "task", {"agentcompass.run": run_id}))
        try:
            assert other.keepalive != session.keepalive  # a folder of its own name in each
            for path in (session.keepalive, posixpath.dirname(session.keepalive) + "/planted"):
                done = await session.exec(["sh", "-c", f"echo evil > {path}"], user="0")
                assert done.exit_code != 0 and "Read-only file system" in done.stderr, done
            done = await session.exec(["rm", "-f", session.keepalive], user="0")
            assert done.exit_code != 0, done
            arch = {"x86_64": "amd64", "aarch64": "arm64"}[platform.machine()]
            for s in (session, other):
                done = await s.exec(["md5sum", s.keepalive])
                assert done.stdout.split()[0] == _md5(program(arch)), done
            assert (session.runner_pids, other.runner_pids) == (frozenset(), frozenset())  # not asked for
        finally:
            await other.close()

    scenario({}, body)
    assert (requests.installs, len(requests.volume_writes), requests.tops) == ([], 1, 0)


def test_without_recorded_pids_one_keepalive_is_the_runners_and_a_copy_is_the_agents() -> None:
    """Harbor's check of what the agent left running, on a session whose config turned ``record_pids``
    off: the init and one keepalive under it are the runner's; a copy of the program the agent started
    (under the init too, once its exec ended) is listed."""
    from pytest_agentcompass.benchmarks.harbor.verifier import processes_left

    async def body(provider: DockerEnvironment, session: Any, run_id: str) -> None:
        assert session.runner_pids == frozenset()
        assert await processes_left(session) == []
        done = await session.exec(["sh", "-c", f"{session.keepalive} >/dev/null 2>&1 &"])
        assert done.exit_code == 0, done
        left = await processes_left(session)
        assert [p.args for p in left] == [session.keepalive], left

    scenario({"record_pids": False}, body)


def test_the_volume_outlasts_a_prune_between_containers() -> None:
    """Between two containers nothing runs from the volume, yet ``docker volume prune`` and ``rm`` leave
    it (its holder, a container that never starts, keeps it in use): a volume made again, empty, by
    the next container's mount would leave that container nothing to run."""

    async def body(provider: DockerEnvironment, session: Any, run_id: str) -> None:
        await session.close()
        (volume,) = subprocess.run(
            ["docker", "volume", "ls", "-q", "--filter", f"label=agentcompass.run={run_id}"],
            capture_output=True, text=True, check=True,
        ).stdout.split()  # fmt: skip
        subprocess.run(["docker", "volume", "prune", "-f", "--filter", f"label=agentcompass.run={run_id}"], check=True)
        removed = subprocess.run(["docker", "volume", "rm", volume], capture_output=True, text=True, check=False)
        assert removed.returncode != 0 and "in use" in removed.stderr, removed
        again = await provider.open(provider.build_config(make_plan(), "task", {"agentcompass.run": run_id}))
        try:
            done = await again.exec(["echo", "up"])
            assert (done.exit_code, done.stdout) == (0, "up\n"), done
        finally:
            await again.close()

    scenario({}, body)


def test_an_engine_that_did_not_answer_is_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A volume that failed for want of an answer (not a refusal) is tried again at the next open."""
    from pytest_agentcompass.environments import docker_keepalive

    real, calls = docker_keepalive.make_volume, []

    def flaky(*args: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise requests.exceptions.ConnectionError("connection reset by peer")
        return real(*args)

    monkeypatch.setattr(docker_keepalive, "make_volume", flaky)
    requests_seen = _Requests(monkeypatch)

    async def body(provider: DockerEnvironment, session: Any, run_id: str) -> None:
        assert (len(requests_seen.installs), requests_seen.volume_writes) == (1, [])  # this one: its own copy
        again = await provider.open(provider.build_config(make_plan(), "task", {"agentcompass.run": run_id}))
        await again.close()
        assert (len(requests_seen.installs), len(requests_seen.volume_writes), len(calls)) == (1, 1, 2)

    scenario({}, body)


def test_an_engine_without_the_volume_gets_the_program_in_each_container(monkeypatch: pytest.MonkeyPatch) -> None:
    """Should the volume fail (an engine that refuses volumes), each container gets its own copy,
    written before it starts, as before volumes; its runner pids are recorded when asked for."""
    from pytest_agentcompass.environments import docker_keepalive

    def refused(*args: Any) -> str:
        raise docker.errors.APIError("volumes are not supported here")

    monkeypatch.setattr(docker_keepalive, "make_volume", refused)
    requests = _Requests(monkeypatch)

    async def body(provider: DockerEnvironment, session: Any, run_id: str) -> None:
        assert (len(requests.installs), requests.volume_writes, requests.tops) == (1, [], 1)  # the pids' read
        own = await _keepalive_args(session)
        assert len(own) == 2 and session.keepalive in own[1], own
        changed = {c.path for c in await session.changes()}
        assert not any(p.startswith(KEEPALIVE_PREFIX) for p in changed), changed

    scenario({"record_pids": True}, body)


def _runner(arch: str) -> list[str] | None:
    """How this machine runs a program of ``arch``: natively, under qemu's user mode, or not at all."""
    native = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine())
    if native == arch:
        return []
    emulator = shutil.which("qemu-x86_64-static" if arch == "amd64" else "qemu-aarch64-static")
    return [emulator] if emulator else None


@pytest.mark.parametrize("arch", ["amd64", "arm64"])
def test_the_program_waits_until_a_signal_ends_it(tmp_path: Path, arch: str) -> None:
    runner = _runner(arch)
    if runner is None:
        pytest.skip(f"this machine runs no {arch} program (no qemu-user-static)")
    path = tmp_path / "keepalive"
    path.write_bytes(program(arch))
    path.chmod(0o555)
    proc = subprocess.Popen([*runner, str(path)])
    try:
        # Waiting in its syscall (state S), not exited: a crash or a busy loop never gets there.
        while proc.poll() is None and Path(f"/proc/{proc.pid}/stat").read_text().split(") ")[1][0] != "S":
            time.sleep(0.01)
        assert proc.poll() is None
    finally:
        proc.terminate()
    assert proc.wait() == -signal.SIGTERM
