"""The local provider's process tree: nothing an exec starts outlives it (real processes, real signals)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from processes import kill_with_its_reapers
from test_local_environment import alive, open_session

from pytest_agentcompass import EnvironmentSpec, LocalEnvironment
from pytest_agentcompass.environments import process
from pytest_agentcompass.environments.conformance import make_plan
from pytest_agentcompass.environments.local import LocalSession
from pytest_agentcompass.environments.markers import MARKER, kill_marked

# A daemon as careful as they come: its own session, a double fork, no pipes kept.
DAEMON = "setsid sh -c 'echo $$ > {pidfile}; exec sleep 300' </dev/null >/dev/null 2>&1 &"


def read_pid(path: Path) -> int:
    return int(path.read_text().strip())


def wait_for_file(path: Path, writer: subprocess.Popen[bytes]) -> None:
    """Wait for a process under ``writer`` to write ``path`` (an event, not a duration)."""
    while not path.exists() or not path.read_text().strip():
        assert writer.poll() is None, f"the process meant to write {path} exited with {writer.returncode}"
        asyncio.run(asyncio.sleep(0.02))


def test_exec_returns_when_its_process_exits_not_when_the_pipes_close(tmp_path: Path) -> None:
    async def main() -> None:
        session = await open_session(tmp_path)
        result = await session.exec(["sh", "-c", "sleep 40 & echo $! > bg.pid; echo started"], timeout=30)
        # Before: it waited for the background sleep's copy of stdout and said timed_out at 30 s.
        assert (result.exit_code, result.stdout, result.timed_out) == (0, "started\n", False)
        assert not alive(read_pid(session.root / "bg.pid"))
        await session.close()

    asyncio.run(main())


def test_exit_code_of_the_first_process_is_kept_while_children_are_killed(tmp_path: Path) -> None:
    async def main() -> None:
        session = await open_session(tmp_path)
        result = await session.exec(["sh", "-c", "sleep 40 & exit 7"], timeout=30)
        assert (result.exit_code, result.timed_out) == (7, False)
        killed = await session.exec(["sh", "-c", "kill -TERM $$"])
        assert killed.exit_code == -signal.SIGTERM
        await session.close()

    asyncio.run(main())


def test_a_setsid_child_holding_stdout_dies_at_the_timeout(tmp_path: Path) -> None:
    async def main() -> None:
        session = await open_session(tmp_path)
        # The escaped child keeps stdout; had exec waited for it, it would have written "finished".
        script = "setsid sh -c 'echo $$ > esc.pid; sleep 20; echo x > finished' & sleep 30"
        result = await session.exec(["sh", "-c", script], timeout=2)
        assert result.timed_out
        assert not (session.root / "finished").exists()
        assert not alive(read_pid(session.root / "esc.pid"))
        await session.close()

    asyncio.run(main())


def test_a_daemon_without_pipes_does_not_survive_its_exec(tmp_path: Path) -> None:
    async def main() -> None:
        session = await open_session(tmp_path)
        result = await session.exec(["sh", "-c", DAEMON.format(pidfile="d.pid") + " sleep 1; echo up"])
        assert (result.exit_code, result.stdout) == (0, "up\n")
        assert not alive(read_pid(session.root / "d.pid"))
        await session.close()

    asyncio.run(main())


def test_cancelling_right_after_the_start_does_not_wait_for_the_command(tmp_path: Path) -> None:
    async def main() -> None:
        session = await open_session(tmp_path)
        for ticks in range(4):
            task = asyncio.ensure_future(session.exec(["sh", "-c", "sleep 30; echo x > finished"]))
            for _ in range(ticks):
                await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        await session.close()
        # Had a cancel waited for its command, the first command would have finished by now.
        assert not (session.root / "finished").exists()

    asyncio.run(main())


def test_close_kills_an_exec_nobody_awaits(tmp_path: Path) -> None:
    async def main() -> None:
        session = await open_session(tmp_path)
        pidfile = session.root / "d.pid"
        task = asyncio.ensure_future(session.exec(["sh", "-c", DAEMON.format(pidfile=pidfile) + " sleep 300"]))
        while not pidfile.exists() or not pidfile.read_text().strip():
            await asyncio.sleep(0.02)
        daemon = read_pid(pidfile)
        await session.close()
        assert not alive(daemon)
        result = await task
        assert result.exit_code == -signal.SIGKILL

    asyncio.run(main())


# $PPID is the exec's reaper. Each pid file is written before the attack, so the test knows what to look for.
ATTACK = (
    "echo $PPID > reaper.pid; echo $$ > main.pid; "
    "setsid sh -c 'echo $$ > escaped.pid; exec sleep 351' </dev/null & "
    "while [ ! -s escaped.pid ]; do sleep 0.01; done; kill -{signal} $PPID; exec sleep 352"
)


async def gone(pid: int, within: float = 30.0) -> bool:
    """Whether ``pid`` is dead (a zombie counts) within ``within`` s: a guard against a hang, not a measurement."""
    deadline = time.monotonic() + within
    while alive(pid) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return not alive(pid)


def attacked(reaper_pid: Path) -> bool:
    """Whether the reaper named in ``reaper_pid`` is dead or stopped."""
    if not reaper_pid.exists() or not reaper_pid.read_text().strip():
        return False
    pid = read_pid(reaper_pid)
    return not alive(pid) or process._stopped(pid)


@pytest.mark.parametrize("ending", ["timeout", "close"])
@pytest.mark.parametrize("signal_name", ["KILL", "STOP"])
def test_a_command_that_kills_or_stops_its_reaper_leaves_nothing(tmp_path: Path, signal_name: str, ending: str) -> None:
    """The reaper is the command's parent: a command may kill or stop it. Then the caller kills by the exec's token.

    Before: with the reaper killed, exec returned after 10 s, not timed out, and
    both sleeps (one reparented to init) outlived the close; with it stopped,
    exec took 22 s, and the stopped reaper, its server and the sleeps outlived pytest.
    """

    async def main() -> None:
        session = await open_session(tmp_path)
        script = ATTACK.format(signal=signal_name)
        if ending == "timeout":
            result = await session.exec(["sh", "-c", script], timeout=2)
            assert result.timed_out, result
            # A generous bound that still tells a stopped reaper's two 10 s waits apart from a kill at the timeout.
            assert result.duration < 2 + process._KILL_WAIT
        else:
            running = asyncio.ensure_future(session.exec(["sh", "-c", script]))
            deadline = time.monotonic() + 30  # a guard against a hang, not a measurement
            while not attacked(session.root / "reaper.pid") and time.monotonic() < deadline:
                await asyncio.sleep(0.05)  # the test is about what follows the attack: wait for it to land
        pids = {name: read_pid(session.root / f"{name}.pid") for name in ("reaper", "main", "escaped")}
        try:
            await session.close()
            if ending == "close":
                # Bounded: before, an exec whose reaper was stopped waited for it for ever.
                assert (await asyncio.wait_for(running, 60)).exit_code == -signal.SIGKILL
            survivors = [name for name, pid in pids.items() if not await gone(pid)]
            assert survivors == [], f"{survivors} outlived the {ending}"
        finally:
            for pid in pids.values():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    asyncio.run(main())


OWNER = """
import asyncio, sys
from pathlib import Path
from pytest_agentcompass.environments.local import LocalSession

async def main():
    session = LocalSession(Path(sys.argv[1]), run_id=sys.argv[2])
    await session.exec(["sh", "-c", sys.argv[3]])

asyncio.run(main())
"""


def test_kill_9_of_the_owner_kills_what_its_execs_started(tmp_path: Path) -> None:
    pidfile = tmp_path / "ws" / "d.pid"
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(tmp_path / "ws"), "r1", DAEMON.format(pidfile=pidfile) + " sleep 300"],
        cwd=Path(__file__).parents[1],
    )
    try:
        wait_for_file(pidfile, owner)
        daemon = read_pid(pidfile)
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        # The reaper sees its control pipe close and kills within milliseconds; the daemon
        # would sleep 300 s, so a minute's patience tells the two apart on any machine.
        for _ in range(3000):
            if not alive(daemon):
                break
            asyncio.run(asyncio.sleep(0.02))
        assert not alive(daemon)
    finally:
        owner.kill()
        owner.wait()
        kill_marked("r1")


def test_kill_marked_finds_processes_by_run_marker_only(tmp_path: Path) -> None:
    run = f"marked-{uuid.uuid4().hex[:8]}"
    other = f"other-{uuid.uuid4().hex[:8]}"
    procs = [
        subprocess.Popen(["sleep", "300"], env={**os.environ, MARKER: run}, start_new_session=True),
        subprocess.Popen(["sleep", "300"], env={**os.environ, MARKER: run + "x"}),
        subprocess.Popen(["sleep", "300"], env={**os.environ, MARKER: other}),
    ]
    try:
        assert kill_marked(run) == 1
        assert procs[0].wait() == -signal.SIGKILL
        assert procs[1].poll() is None and procs[2].poll() is None
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_sweep_kills_processes_left_by_a_run_whose_reapers_died(tmp_path: Path) -> None:
    run = f"dead-{uuid.uuid4().hex[:8]}"
    script = textwrap.dedent(
        f"""
        import asyncio, sys
        from pathlib import Path
        from pytest_agentcompass.environments.local import LocalSession

        async def main():
            session = LocalSession(Path(sys.argv[1]), run_id={run!r})
            await session.exec(["sh", "-c", {DAEMON.format(pidfile=tmp_path / "d.pid") + " sleep 300"!r}])
        asyncio.run(main())
        """
    )
    owner = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "ws")], cwd=Path(__file__).parents[1])
    try:
        wait_for_file(tmp_path / "d.pid", owner)
        daemon = read_pid(tmp_path / "d.pid")
    finally:
        kill_with_its_reapers(owner.pid)  # as the OOM killer might
        owner.wait()
    provider = LocalEnvironment(EnvironmentSpec(params={"base_dir": str(tmp_path)}))
    try:
        assert alive(daemon)  # no reaper was left to kill it
        assert asyncio.run(provider.sweep(run)) >= 1
        assert not alive(daemon)
    finally:
        kill_marked(run)


def test_the_marker_names_the_run(tmp_path: Path) -> None:
    async def main() -> None:
        provider = LocalEnvironment(EnvironmentSpec(params={"base_dir": str(tmp_path)}))
        config = provider.build_config(make_plan(), "task", {"agentcompass.run": "run-42"})
        session = await provider.open(config)
        assert isinstance(session, LocalSession)
        result = await session.exec(["sh", "-c", f'echo "${MARKER}"'])
        assert result.stdout == "run-42\n"
        await session.close()

    asyncio.run(main())


def test_a_session_closes_its_reaper_server_before_the_interpreter_exits(tmp_path: Path) -> None:
    """The reaper server is stopped at unconfigure: no socket or process is left to the
    interpreter's exit (which ``-X dev`` reports as ResourceWarnings), and no server outlives pytest."""
    (tmp_path / "suite.py").write_text(
        textwrap.dedent(
            """
            from pytest_agentcompass import HarnessFreeBenchmark, RunResult, TaskSpec

            class Echo(HarnessFreeBenchmark):
                def load_tasks(self, req):
                    return [TaskSpec(task_id="t")]

                async def run_task(self, task, prepared, env, req, plan):
                    done = await env.exec(["true"])
                    return RunResult(task.task_id, metadata={"code": done.exit_code})

                async def evaluate(self, task, prepared, result, req, plan, env=None):
                    return RunResult(task.task_id, score=1.0)
            """
        )
    )
    (tmp_path / "agentcompass.yaml").write_text(
        "output_dir: runs\nrequests:\n  - name: r\n    benchmark: {id: 'suite:Echo'}\n    environment: {id: local}\n"
    )
    done = subprocess.run(
        [sys.executable, "-X", "dev", "-W", "default", "-m", "pytest", "--agentcompass=agentcompass.yaml", "-q"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])},
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "ResourceWarning" not in done.stdout + done.stderr, done.stderr[-2000:]
    assert "still running" not in done.stderr
