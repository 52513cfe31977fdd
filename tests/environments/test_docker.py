"""The docker provider against a real engine (``scripts/start-docker.sh`` starts one)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from pytest_agentcompass import BaseEnvironment, EnvironmentSpec
from pytest_agentcompass.environments.conformance import EnvironmentConformance
from pytest_agentcompass.environments.docker import DockerEnvironment

from conftest import start_pytest, tracing_request, write_config
from tracing import read_trace

IMAGE = "agentcompass-busybox:test"


def engine_ready() -> bool:
    probe = subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True, check=False)
    return probe.returncode == 0


if not engine_ready():
    if os.environ.get("CI"):
        raise RuntimeError("CI must start the Docker engine first: bash scripts/start-docker.sh")
    pytest.skip("no Docker engine with the test image (run scripts/start-docker.sh)", allow_module_level=True)


def containers(label: str) -> list[str]:
    out = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label={label}"], capture_output=True, text=True, check=True
    ).stdout
    return out.split()


def leftovers(label: str) -> list[str]:
    """The containers and volumes (the keepalive's) with ``label``: what a run must not leave."""
    out = subprocess.run(
        ["docker", "volume", "ls", "-q", "--filter", f"label={label}"], capture_output=True, text=True, check=True
    ).stdout
    return containers(label) + out.split()


class TestDockerEnvironment(EnvironmentConformance):
    def make_provider(self, tmp_path: Path) -> BaseEnvironment:
        self.mark = uuid.uuid4().hex
        return DockerEnvironment(EnvironmentSpec(id="docker", params={"image": IMAGE}))

    def labels(self) -> dict[str, str]:
        return {"agentcompass.conformance": self.mark}

    def leaked(self, provider: BaseEnvironment, tmp_path: Path) -> list[Any]:
        return containers(f"agentcompass.conformance={self.mark}")


def docker_request(name: str, trace: Path, **kwargs: Any) -> dict[str, Any]:
    request = tracing_request(name, trace, **kwargs)
    request["environment"]["id"] = "docker"
    request["environment"]["params"] = {"image": IMAGE}
    return request


@pytest.mark.parametrize("mode", ["none", "reuse", "fresh"])
def test_tasks_run_in_containers_and_leave_none(pytester: pytest.Pytester, trace: Path, mode: str) -> None:
    network = {"network": {"baseline": "full", "run": "disabled", "evaluation": "disabled"}}
    write_config(pytester, [docker_request("d", trace, n=3, mode=mode, wrong=["t2"], environment=network)])
    result = pytester.runpytest("--agentcompass=agentcompass.yaml", "--agentcompass-progress=off")
    result.assert_outcomes(passed=2, failed=1)
    (run_dir,) = (pytester.path / "runs/d").iterdir()
    assert leftovers(f"agentcompass.run={run_dir.name}") == []
    evaluate = [e for e in read_trace(trace) if e["event"] == "evaluate"]
    if mode == "fresh":
        assert all(e["sees_workspace"] is False and e["env"].startswith("container") for e in evaluate)
    if mode == "reuse":
        assert all(e["sees_workspace"] is True for e in evaluate)


def test_unreachable_engine_is_one_clear_error(
    pytester: pytest.Pytester, trace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{pytester.path}/no-such-docker.sock")
    write_config(pytester, [docker_request("d", trace, n=2)])
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(["*request 'd': the Docker engine at unix://*no-such-docker.sock is not reachable*"])
    assert "Traceback" not in result.stdout.str()
    assert not [e for e in read_trace(trace) if e["event"] == "prepare_task"]


def test_missing_image_is_a_preflight_error(pytester: pytest.Pytester, trace: Path) -> None:
    request = docker_request("d", trace, n=1)
    request["environment"]["params"]["image"] = "agentcompass-no-such-image:1"
    write_config(pytester, [request])
    result = pytester.runpytest("--agentcompass=agentcompass.yaml")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*docker image 'agentcompass-no-such-image:1' is not on the engine*"])


def test_a_failed_pull_is_a_preflight_error(pytester: pytest.Pytester, trace: Path) -> None:
    request = docker_request("d", trace, n=2)
    request["environment"]["params"] |= {"image": "agentcompass-no-such-image:1", "pull": True}
    write_config(pytester, [request])
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml")
    assert result.ret == pytest.ExitCode.TESTS_FAILED and "INTERNALERROR" not in result.stdout.str()
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(["  request 'd': environment 'docker' preflight: APIError: *no-such-image*"])
    assert len([line for line in result.outlines if "no-such-image" in line]) == 1  # once, not per task


def test_interrupt_removes_every_container(pytester: pytest.Pytester, trace: Path) -> None:
    write_config(pytester, [docker_request("d", trace, n=4, sleep={"run": 60})], task_concurrency=4)
    proc = start_pytest(pytester)
    deadline = time.monotonic() + 60
    while len([e for e in read_trace(trace) if e["event"] == "run_task"]) < 4:
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)
    (run_dir,) = (pytester.path / "runs/d").iterdir()
    assert len(containers(f"agentcompass.run={run_dir.name}")) == 4
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
    assert leftovers(f"agentcompass.run={run_dir.name}") == []
    assert json.loads((run_dir / "run_info.json").read_text())["status"] == "interrupted"


STUBBORN = """
import asyncio, dataclasses
from pytest_agentcompass import HarnessFreeBenchmark, RunResult, TaskSpec
from pytest_agentcompass.environments.docker import DockerEnvironment, DockerSession

class Sleepy(HarnessFreeBenchmark):
    def load_tasks(self, req):
        return [TaskSpec(f"t{i}") for i in range(3)]
    async def run_task(self, task, prepared, env, req, plan):
        open("started-" + task.task_id, "w").close()  # the session is open: its close will hang
        await env.exec(["sleep", "60"], timeout=120)
        return RunResult(task.task_id, output="late")
    def evaluate(self, task, prepared, result, req, plan, env=None):
        return dataclasses.replace(result, score=1.0)

class StubbornSession(DockerSession):
    async def close(self):
        await asyncio.sleep(60)  # a cleanup that never ends on its own
        await super().close()

class StubbornDocker(DockerEnvironment):
    async def open(self, config):
        session = await super().open(config)
        session.__class__ = StubbornSession
        return session
"""


def test_second_interrupt_still_removes_this_runs_containers(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(stubborn=STUBBORN)
    environment = {"id": "stubborn.py:StubbornDocker", "params": {"image": IMAGE}}
    request = {"name": "d", "benchmark": {"id": "stubborn.py:Sleepy"}, "environment": environment}
    write_config(pytester, [request], task_concurrency=3, cleanup_grace_seconds=120)
    proc = start_pytest(pytester)
    deadline = time.monotonic() + 120

    def run_dirs() -> list[Path]:  # a run still being assembled has a "." name
        folder = pytester.path / "runs/d"
        return [p for p in folder.iterdir() if not p.name.startswith(".")] if folder.is_dir() else []

    # Every task is past open (a container alone may still be starting, and its cleanup is quick).
    while len(list(pytester.path.glob("started-*"))) < 3:
        assert time.monotonic() < deadline and proc.poll() is None, "tasks never started"
        time.sleep(0.1)
    (run_dir,) = run_dirs()
    proc.send_signal(signal.SIGINT)
    time.sleep(1.0)
    assert proc.poll() is None, proc.communicate()[0]  # waiting on the stubborn cleanups, within the grace
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
    assert leftovers(f"agentcompass.run={run_dir.name}") == [], out
    assert "Task was destroyed" not in out and "Event loop is closed" not in out, out
    assert json.loads((run_dir / "run_info.json").read_text())["status"] == "interrupted", out
    assert not (run_dir / "run.lock").exists(), out


def test_sweep_removes_what_a_killed_run_left() -> None:
    import asyncio

    from pytest_agentcompass.environments.conformance import make_plan

    provider = DockerEnvironment(EnvironmentSpec(id="docker", params={"image": IMAGE}))
    run_id = f"sweep-{uuid.uuid4().hex[:8]}"

    async def scenario() -> int:
        for _ in range(2):  # opened and never closed, as by a SIGKILLed process
            await provider.open(provider.build_config(make_plan(), "task", {"agentcompass.run": run_id}))
        assert len(containers(f"agentcompass.run={run_id}")) == 2
        return await provider.sweep(run_id)

    assert asyncio.run(scenario()) == 2  # the runner's keepalive volume and its holder are not counted
    assert leftovers(f"agentcompass.run={run_id}") == []
    assert containers(f"agentcompass.keepalive-run={run_id}") == []  # the volume's holder went first


def test_cancel_while_the_exec_is_starting_kills_it() -> None:
    """A cancel that lands while ``exec_start`` is in flight still kills the exec once it runs."""
    import asyncio

    from pytest_agentcompass.environments.conformance import make_plan

    provider = DockerEnvironment(EnvironmentSpec(id="docker", params={"image": IMAGE}))
    mark = uuid.uuid4().hex
    token = uuid.uuid4().hex

    async def scenario() -> str:
        session = await provider.open(provider.build_config(make_plan(), "task", {"agentcompass.conformance": mark}))
        try:
            from pytest_agentcompass.environments import docker_session as docker_module

            real_start = docker_module.exec_output
            loop = asyncio.get_running_loop()
            task: asyncio.Future[Any] | None = None

            def start(*args: Any, **kwargs: Any) -> Any:
                stream = real_start(*args, **kwargs)  # the real engine starts the exec
                assert task is not None
                loop.call_soon_threadsafe(task.cancel)  # the cancel lands while this call is in flight
                time.sleep(0.2)
                return stream

            docker_module.exec_output = start  # type: ignore[assignment]
            task = asyncio.ensure_future(session.exec(["sh", "-c", f"sleep 30; echo {token}"]))
            try:
                with pytest.raises(asyncio.CancelledError):
                    await task
            finally:
                docker_module.exec_output = real_start
            # The scan's own command line holds "[t]oken", never the token itself.
            pattern = f"[{token[0]}]{token[1:]}"
            scan = await session.exec(["sh", "-c", f"grep -l '{pattern}' /proc/[0-9]*/cmdline || true"])
            return scan.stdout
        finally:
            await session.close()
            await provider.aclose()

    assert asyncio.run(scenario()) == ""
    assert containers(f"agentcompass.conformance={mark}") == []


def test_a_cancel_right_after_the_container_started_removes_it() -> None:
    """A cancel that lands while the open still reads the runner's pids (the container runs, the
    session is not yet returned: nothing else knows of it) removes the container."""
    import asyncio

    from pytest_agentcompass.environments import docker as docker_module
    from pytest_agentcompass.environments.conformance import make_plan

    provider = DockerEnvironment(EnvironmentSpec(id="docker", params={"image": IMAGE, "record_pids": True}))
    mark = uuid.uuid4().hex
    real = docker_module.runner_processes
    loop: asyncio.AbstractEventLoop | None = None
    task: asyncio.Future[Any] | None = None

    def pids(container: Any) -> frozenset[int]:
        assert loop is not None and task is not None
        found = real(container)  # the real engine started the container
        loop.call_soon_threadsafe(task.cancel)  # the cancel lands while this call is in flight
        time.sleep(0.2)
        return found

    async def scenario() -> None:
        nonlocal loop, task
        loop = asyncio.get_running_loop()
        config = provider.build_config(make_plan(), "task", {"agentcompass.conformance": mark})
        task = asyncio.ensure_future(provider.open(config))
        try:
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            await provider.aclose()

    docker_module.runner_processes = pids  # type: ignore[assignment]
    try:
        asyncio.run(scenario())
    finally:
        docker_module.runner_processes = real
        left = containers(f"agentcompass.conformance={mark}")
        # Whatever failed (the open not cancelled, too), the next tests find no container of this one.
        subprocess.run(["docker", "rm", "-f", *left], capture_output=True, check=False)
    assert left == []


def run_in_session(scenario: Any) -> Any:
    """Run ``scenario(session)`` in a new container, removed after."""
    import asyncio

    from pytest_agentcompass.environments.conformance import make_plan

    provider = DockerEnvironment(EnvironmentSpec(id="docker", params={"image": IMAGE}))
    mark = uuid.uuid4().hex

    async def main() -> Any:
        session = await provider.open(provider.build_config(make_plan(), "task", {"agentcompass.conformance": mark}))
        try:
            return await scenario(session)
        finally:
            await session.close()
            await provider.aclose()

    try:
        return asyncio.run(main())
    finally:
        assert containers(f"agentcompass.conformance={mark}") == []


def test_a_command_in_a_container_that_stopped_says_how_it_ended() -> None:
    """The engine answers an exec in a stopped container with a bare 409: the error says how the
    container ended instead (here killed from outside: exit code 137), a SessionError like others."""
    from pytest_agentcompass.vocabulary.errors import SessionError

    async def scenario(session: Any) -> str:
        subprocess.run(["docker", "kill", session.container.id], check=True, capture_output=True)
        with pytest.raises(SessionError) as raised:
            await session.exec(["echo", "up"])
        return str(raised.value)

    said = run_in_session(scenario)
    assert "is not running any more (exited, exit code 137; at " in said, said
    # The time it ended has nanoseconds, which may read "409" (a run failed on "...12.393106409Z").
    without_time = re.sub(r"; at [^)]*\)", "; at <time>)", said)
    assert "409" not in without_time and "OOMKilled" not in said, said


def test_a_command_that_drops_the_exec_marker_still_times_out() -> None:
    """The marker the provider sets is the command's to unset: the timeout does not depend on it."""

    async def scenario(session: Any) -> tuple[bool, float]:
        started = time.monotonic()
        result = await session.exec(["sh", "-c", "unset AGENTCOMPASS_EXEC; exec sleep 100"], timeout=2)
        return result.timed_out, time.monotonic() - started

    timed_out, took = run_in_session(scenario)
    assert timed_out and took < 20  # generous; it blocked 60 s, then raised TimeoutError


def test_nothing_the_exec_started_survives_its_timeout() -> None:
    """A child that left the exec's session and environment is gone once the exec returns."""

    async def scenario(session: Any) -> tuple[bool, str]:
        script = "env -i setsid sleep 334 & sleep 0.5; exec sleep 100"
        result = await session.exec(["sh", "-c", script], timeout=2)
        return result.timed_out, (await session.exec(["ps", "-o", "args"], timeout=30)).stdout

    timed_out, processes = run_in_session(scenario)
    assert timed_out
    assert "sleep 334" not in processes.splitlines(), processes


def test_a_quiet_exec_outlasts_the_clients_request_timeout() -> None:
    """The client's request timeout does not end a quiet exec's output (it raised TimeoutError at 60 s)."""

    async def scenario(session: Any) -> Any:
        session.client.api.timeout = 2  # the SDK's 60 s, made short
        try:
            return await session.exec(["sh", "-c", "sleep 6; echo done"], timeout=30)
        finally:
            session.client.api.timeout = 60

    result = run_in_session(scenario)
    assert (result.exit_code, result.stdout, result.timed_out) == (0, "done\n", False)


def test_a_command_run_as_another_user_is_killed_at_its_timeout() -> None:
    """Root cannot read another user's process environments (no CAP_SYS_PTRACE): the kill still finds them."""

    async def scenario(session: Any) -> tuple[bool, str]:
        result = await session.exec(["sh", "-c", "sleep 335 & exec sleep 100"], timeout=2, user="65534")
        return result.timed_out, (await session.exec(["ps", "-o", "args"], timeout=30)).stdout

    timed_out, processes = run_in_session(scenario)
    assert timed_out
    assert not [line for line in processes.splitlines() if "sleep 335" in line or "sleep 100" in line], processes


def test_resuming_two_requests_leaves_the_other_requests_containers_alone(
    pytester: pytest.Pytester, trace: Path
) -> None:
    """Both requests resume run X in one session. The second one opens while the first already runs (the
    pipelining): its sweep of X's leftovers removed the first one's containers of this very session."""
    a = docker_request("a", trace, n=2, execution={"keep_environment": True})
    write_config(pytester, [a, docker_request("b", trace, n=1)], task_concurrency=1)
    args = ("--agentcompass=agentcompass.yaml", "--agentcompass-progress=off")
    pytester.runpytest(*args).assert_outcomes(passed=3)
    (run_dir,) = (pytester.path / "runs/a").iterdir()
    run_id = run_dir.name
    mine = f"agentcompass.run={run_id}"
    stray = ""
    try:
        # The kept containers run keepalives of their own: the run's volume went with the run.
        assert len(leftovers(mine)) == len(containers(mine)) == 2
        for kept in containers(mine):
            subprocess.run(["docker", "rm", "-f", kept], capture_output=True, check=True)
        for name in ("a", "b"):  # both cut short: resumed, with nothing done
            folder = pytester.path / "runs" / name / run_id
            info = json.loads((folder / "run_info.json").read_text())
            (folder / "run_info.json").write_text(json.dumps({**info, "status": "interrupted"}))
            for detail in (folder / "details").iterdir():
                detail.unlink()
        # What the cut-short run left behind: the resume removes it.
        stray = subprocess.run(
            ["docker", "run", "-d", "--label", mine, "--label", "agentcompass.request=b", IMAGE, "sleep", "300"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        result = pytester.runpytest(*args)
        result.assert_outcomes(passed=3)
        assert stray[:12] not in subprocess.run(["docker", "ps", "-aq"], capture_output=True, text=True).stdout
        # Request a's two kept containers of the resumed run are both still there.
        kept = set(containers("agentcompass.request=a")) & set(containers(mine))
        assert len(kept) == 2, result.stdout.str()
        info = json.loads((run_dir / "run_info.json").read_text())
        assert info["status"] == "completed" and len(info["kept_environments"]) == 2
    finally:
        for left in containers(mine) + ([stray] if stray else []):
            subprocess.run(["docker", "rm", "-f", left], capture_output=True, check=False)
