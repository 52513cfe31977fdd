"""Harbor verifier modes on the real engine: what a snapshot leaves behind (nothing, also after
Ctrl-C or kill -9), a separate verifier from a prebuilt image, and reward files on the edge."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid

import pytest
from harbor_tasks import (
    BUSYBOX,
    BUSYBOX_DOCKERFILE,
    containers_of,
    details,
    docker_lines,
    harbor_request,
    require_images,
    write_task,
)

from conftest import start_pytest, write_config

require_images(BUSYBOX)

SLOW_VERIFIER = "#!/bin/bash\nsleep 120\necho 1 > /logs/verifier/reward.txt\n"


def _images(run_id: str) -> list[str]:
    return docker_lines("images", "-q", "--filter", f"label=agentcompass.run={run_id}")


def _wait_for_snapshot(pytester: pytest.Pytester, proc: subprocess.Popen[str]) -> str:
    """The run id, once its snapshot image exists and its verifier container runs."""
    deadline = time.monotonic() + 180
    while True:
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()[0] if proc.poll() else ""
        runs = [p for p in (pytester.path / "runs" / "snap").glob("*") if not p.name.startswith(".")]
        # The task's container is stopped once frozen: a running one is the verifier's, from the snapshot.
        if (
            runs
            and _images(runs[0].name)
            and docker_lines(
                "ps", "-q", "--filter", f"label=agentcompass.run={runs[0].name}", "--filter", "status=running"
            )
        ):
            return runs[0].name
        time.sleep(0.2)


def test_ctrl_c_during_a_snapshot_verification_leaves_nothing(pytester: pytest.Pytester) -> None:
    write_task(pytester.path / "tasks", "t", test=SLOW_VERIFIER, verifier_timeout=300)
    write_config(pytester, [harbor_request("snap", "tasks", params={"verifier_mode": "snapshot"})])
    proc = start_pytest(pytester)
    run_id = _wait_for_snapshot(pytester, proc)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
    assert containers_of(run_id) == [] and _images(run_id) == [], out


def test_a_killed_runs_snapshot_is_swept_by_the_next_run(pytester: pytest.Pytester) -> None:
    task = write_task(pytester.path / "tasks", "t", test=SLOW_VERIFIER, verifier_timeout=300)
    write_config(pytester, [harbor_request("snap", "tasks", params={"verifier_mode": "snapshot"})])
    proc = start_pytest(pytester, own_group=True)
    run_id = _wait_for_snapshot(pytester, proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert _images(run_id) and containers_of(run_id)  # what kill -9 leaves
    (task / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    again = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider")
    again.assert_outcomes(passed=1)
    assert containers_of(run_id) == [] and _images(run_id) == [], again.stdout.str()


def test_a_separate_verifier_from_a_prebuilt_image(pytester: pytest.Pytester) -> None:
    # The verifier's image brings its tests; the agent's container has none of them.
    image = f"agentcompass-verifier-test:{uuid.uuid4().hex[:12]}"
    baked = (
        '#!/bin/bash\n[ "$(cat /app/out.txt)" = done ] && [ -e /tests/baked ] && echo 1 > /logs/verifier/reward.txt\n'
    )
    context = pytester.path / "verifier-image"
    context.mkdir()
    (context / "Dockerfile").write_text(BUSYBOX_DOCKERFILE + "COPY test.sh /tests/test.sh\nRUN touch /tests/baked\n")
    (context / "test.sh").write_text(baked)
    subprocess.run(["docker", "build", "-q", "-t", image, str(context)], check=True, capture_output=True)
    try:
        toml = (
            'version = "1.0"\nartifacts = ["/app/out.txt"]\n[verifier]\ntimeout_sec = 60\n'
            f'[verifier.environment]\ndocker_image = "{image}"\nallow_internet = false\n'
        )
        task = write_task(pytester.path / "tasks", "t", toml=toml, solve="#!/bin/bash\necho done > /app/out.txt\n")
        (task / "tests" / "test.sh").unlink()  # the image has the verifier: the task folder need not
        write_config(pytester, [harbor_request("apart", "tasks")])
        result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider")
        result.assert_outcomes(passed=1)
        run = next((pytester.path / "runs" / "apart").iterdir())
        plan = json.loads((run / "run_info.json").read_text())["resolved_execution_plans"]["t"]["0"]
        assert plan["environment"]["verifier_mode"] == "separate" and plan["evaluation_network_policy"] == "disabled"
    finally:
        subprocess.run(["docker", "rmi", "-f", image], capture_output=True, check=False)


@pytest.mark.parametrize(
    ("test", "status", "message"),
    [
        (
            "head -c 62914560 /dev/zero > /logs/verifier/reward.txt",
            "evaluation_error",
            "*reward.txt is 62914560 bytes, too large*",
        ),
        (
            "echo 1e300 > /logs/verifier/reward.txt",
            "evaluation_error",
            "*reward.txt holds '1e300', outside the reward range [[]0, 1[]]*",
        ),
        (
            'echo \'{"": 1, "bad key/with slash": 1, "Reward": "high", "reward": 0.5}\' > /logs/verifier/reward.json',
            "scored",
            "",
        ),
        # Not the engine's fault: an evaluation error of the task, never an environment error.
        ("ln -s /etc/hostname /logs/verifier/reward.txt", "evaluation_error", "*reward.txt is not a regular file*"),
    ],
    ids=["too-large", "out-of-range", "odd-keys", "link"],
)
def test_reward_files_on_the_edge(pytester: pytest.Pytester, test: str, status: str, message: str) -> None:
    write_task(pytester.path / "tasks", "t", test=f"#!/bin/bash\n{test}\n")
    write_config(pytester, [harbor_request("edge", "tasks", execution={"pass_threshold": 0.5})])
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider")
    detail = details(pytester.path, "edge")["t"]
    assert detail["status"] == status, detail["error"]
    if message:
        result.stdout.fnmatch_lines([message])
    else:
        ignored = detail["metadata"]["rewards_ignored"]
        assert [entry.split(":")[0] for entry in ignored] == ["''", "'bad key/with slash'", "'Reward'"], ignored
        assert detail["score"] == 0.5 and detail["metadata"]["rewards"] == {"reward": 0.5}


@pytest.mark.parametrize(
    ("test", "stopped"),
    [
        # The engine's archive lists a.bin first: a copy that stops at a file it cannot afford to
        # read through never reaches reward.txt.
        ("truncate -s 30000000 /logs/verifier/a.bin\necho 1 > /logs/verifier/reward.txt", True),
        # The archive names the file once, as a.txt; reward.txt is a hard link to it there.
        ("echo 1 > /logs/verifier/a.txt\nln /logs/verifier/a.txt /logs/verifier/reward.txt", False),
    ],
    ids=["after-a-large-log", "hard-link"],
)
def test_a_reward_file_the_log_copy_leaves_unsaid_is_read_alone(
    pytester: pytest.Pytester, test: str, stopped: bool
) -> None:
    # The reward files come out of the copy of /logs/verifier, unless it cannot say what they are.
    write_task(pytester.path / "tasks", "t", test=f"#!/bin/bash\n{test}\n")
    write_config(pytester, [harbor_request("unsaid", "tasks")])
    pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider").assert_outcomes(
        passed=1
    )
    detail = details(pytester.path, "unsaid")["t"]
    assert detail["score"] == 1.0 and detail["metadata"]["rewards"] == {"reward": 1.0}
    copied = detail["metadata"]["verifier"]["copied"]
    if stopped:
        assert copied["stopped"].startswith("stopped at a.bin (30000000 bytes)") and copied["files"] == 0, copied
    else:
        assert "stopped" not in copied and copied["stored"] == ["a.txt"], copied


HEARTBEAT_SOLVE = """#!/bin/bash
# The job outlives this script: the oracle returns when solve.sh does, the job keeps beating.
( while :; do date +%s >> /app/heartbeat.log; sleep 1; done ) &
while [ "$(wc -l 2>/dev/null < /app/heartbeat.log || echo 0)" -lt 2 ]; do sleep 0.2; done
echo "heartbeat started"
"""
HEARTBEAT_TEST = """#!/bin/bash
beats=$(grep -c '^[0-9][0-9]*$' /app/heartbeat.log 2>/dev/null || echo 0)
if [ "$beats" -ge 2 ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""


def test_a_reference_solution_that_leaves_a_service_running(pytester: pytest.Pytester) -> None:
    # The agent's time is short: an oracle that waited for the job's output (a tee did) would time out.
    toml = 'version = "1.0"\n[verifier]\ntimeout_sec = 60\n[agent]\ntimeout_sec = 20\n'
    write_task(pytester.path / "tasks", "heartbeat", toml=toml, solve=HEARTBEAT_SOLVE, test=HEARTBEAT_TEST)
    write_config(
        pytester,
        [harbor_request(mode, "tasks", params={"verifier_mode": mode}) for mode in ("shared", "snapshot")],
    )
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    for mode in ("shared", "snapshot"):
        run = next((pytester.path / "runs" / mode).iterdir())
        transcript = run / "artifacts" / "heartbeat" / "attempt-0" / "agent" / "oracle.txt"
        assert transcript.read_text().strip() == "heartbeat started"
        checks = {f["check"] for f in details(pytester.path, mode)["heartbeat"]["metadata"].get("integrity") or []}
        # Shared mode names the job that was still running; snapshot mode stopped it first.
        assert checks == ({"agent-processes"} if mode == "shared" else set()), checks
