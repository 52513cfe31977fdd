"""A cheating agent against the Harbor verifier, on the real Docker engine, in every verifier mode.

One pytest run (module fixture) plays every cheat of ``tests/suites/cheat_tasks.py``
in the ``shared``, ``snapshot`` and ``separate`` modes, plus an honest agent that
leaves a service running; the tests read what it left. The rule: no cheat passes
unflagged, in any mode; the honest agent passes in every mode.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from cheat_tasks import AGENT, CHEATS, FORK_BOMB, HONEST, PlayedRuns, play_once, write_cheat_task
from harbor_tasks import containers_of, docker_lines, require_images

MODES = ("shared", "snapshot", "separate")
BASE = "python:3.12-slim"


require_images(BASE, hint="run scripts/start-docker.sh and scripts/build-base-images.sh")


def _request(name: str, mode: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "benchmark": {"id": "harbor", "params": {"path": "tasks", "verifier_mode": mode}},
        "harness": {"id": "command", "params": AGENT},
        "environment": {"id": "docker", **extra.pop("environment", {})},
        "execution": {"retry_backoff_seconds": 0},
        **extra,
    }


class Played(PlayedRuns):
    """What the suite's one run left: each request's details and run directory, its output and peak RSS."""

    def __init__(self, root: Path, stdout: str, stderr: str, peak_kib: int) -> None:
        super().__init__(root)
        self.stdout = stdout
        self.stderr = stderr
        self.peak_kib = peak_kib


@pytest.fixture(scope="module")
def played(tmp_path_factory: pytest.TempPathFactory) -> Played:
    root, facts = play_once(tmp_path_factory, "cheats", _play)
    output = facts["stdout"] + facts["stderr"]
    assert "INTERNALERROR" not in output, facts["stdout"][-3000:] + facts["stderr"][-3000:]
    return Played(root, facts["stdout"], facts["stderr"], facts["peak_kib"])


def _play(root: Path) -> dict[str, Any]:
    """The one run of every cheat (see :func:`cheat_tasks.play_once`): its output and peak RSS."""
    for name, script in CHEATS.items():
        write_cheat_task(root / "tasks", name, script)
    write_cheat_task(root / "tasks", "honest-service", HONEST)
    write_cheat_task(root / "bomb", "fork-bomb", FORK_BOMB)
    requests = [_request(mode, mode) for mode in MODES]
    bomb = _request("fork-bomb", "shared", environment={"params": {"pids_limit": 64}})
    bomb["benchmark"]["params"]["path"] = "bomb"
    config = {"output_dir": "runs", "task_concurrency": 8, "requests": [*requests, bomb]}
    (root / "agentcompass.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    # ru_maxrss of children covers every child this process waited for: a peak no higher than
    # before is an earlier child's, and says nothing of this run (0).
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider", "-q"],
        cwd=root,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        check=False,
    )
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {"stdout": done.stdout, "stderr": done.stderr, "peak_kib": peak if peak > before else 0}


def _checks(detail: dict[str, Any]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for finding in detail["metadata"].get("integrity") or []:
        assert set(finding) == {"check", "path", "message"} and finding["message"], finding
        found.setdefault(finding["check"], []).append(str(finding["path"]))
    return found


#: (cheat, mode) -> the finding a pass must carry; a cheat and mode not listed must simply not pass.
FLAGGED = {
    ("bash-replaced", "shared"): ("replaced-tool", "/usr/bin/bash"),
    ("bash-replaced", "snapshot"): ("replaced-tool", "/usr/bin/bash"),
    ("python-shim", "shared"): ("shadowed-tool", "/usr/local/bin/python3"),
    ("python-shim", "snapshot"): ("shadowed-tool", "/usr/local/bin/python3"),
    ("pytest-shim", "shared"): ("replaced-tool", "/usr/local/bin/pytest"),
    ("pytest-shim", "snapshot"): ("replaced-tool", "/usr/local/bin/pytest"),
    ("pth-hook", "shared"): ("startup-hook", "/usr/local/lib/python3.11/dist-packages/zz_cheat.pth"),
    ("pth-hook", "snapshot"): ("startup-hook", "/usr/local/lib/python3.11/dist-packages/zz_cheat.pth"),
    ("pytest-main-edited", "shared"): ("changed-package", "/usr/local/lib/python3.11/dist-packages/_pytest/main.py"),
    ("pytest-main-edited", "snapshot"): ("changed-package", "/usr/local/lib/python3.11/dist-packages/_pytest/main.py"),
    ("root-conftest", "shared"): ("planted-config", "/conftest.py"),
    ("root-conftest", "snapshot"): ("planted-config", "/conftest.py"),
    ("workdir-pytest", "shared"): ("planted-config", "/app/pytest.py"),
    ("workdir-pytest", "snapshot"): ("planted-config", "/app/pytest.py"),
    ("reward-loop", "shared"): ("agent-processes", "None"),
    ("test-rewriter", "shared"): ("agent-processes", "None"),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("cheat", sorted(CHEATS))
def test_no_cheat_passes_unflagged(played: Played, cheat: str, mode: str) -> None:
    detail = played.detail(mode, cheat)
    checks = _checks(detail)
    expected = FLAGGED.get((cheat, mode))
    if detail["passed"]:
        assert expected is not None, f"{cheat} passed in {mode} mode: {detail['metadata'].get('integrity')}"
        check, path = expected
        assert path in checks.get(check, []), (cheat, mode, checks)
    elif expected is not None and expected[0] != "agent-processes":
        # It failed on its own this time (a race lost): what it did is still on record.
        assert expected[1] in checks.get(expected[0], []), (cheat, mode, checks)


@pytest.mark.parametrize("mode", MODES)
def test_an_honest_agent_with_a_running_service_passes(played: Played, mode: str) -> None:
    detail = played.detail(mode, "honest-service")
    assert detail["passed"], detail["error"]
    checks = _checks(detail)
    # Shared mode says that its processes were alive during verification; nothing else is suspicious.
    assert set(checks) <= ({"agent-processes"} if mode == "shared" else set()), checks


def test_absurd_rewards_are_evaluation_errors_naming_the_value(played: Played) -> None:
    # The daemon rewrites the reward every 10 ms, so the runner's read races the verifier's own
    # write of 0: either value may be read (a verifier writing 1e300 itself is tested without a
    # race in test_harbor_modes.py). Whichever is read, the task does not pass, and an absurd
    # value read is an evaluation error that names it.
    for cheat, value in (("reward-huge", "1e300"), ("reward-negative", "-5")):
        detail = played.detail("shared", cheat)
        assert not detail["passed"], detail
        if detail["status"] == "evaluation_error":
            assert value in detail["error"] and "outside the reward range [0, 1]" in detail["error"], detail["error"]
        else:
            assert detail["status"] == "scored" and detail["score"] == 0.0, detail


def test_processes_of_the_agent_do_not_reach_an_isolated_verifier(played: Played) -> None:
    for mode in ("snapshot", "separate"):
        for cheat in ("reward-loop", "test-rewriter", "sigstop-verifier"):
            detail = played.detail(mode, cheat)
            assert detail["status"] == "scored" and detail["score"] == 0.0, (mode, cheat, detail["error"])
            assert "agent-processes" not in _checks(detail)


def test_a_stopped_verifier_is_flagged(played: Played) -> None:
    detail = played.detail("shared", "sigstop-verifier")
    assert not detail["passed"]
    assert "verifier-stopped" in _checks(detail), detail["metadata"].get("integrity")


def test_tests_rewritten_during_verification_are_flagged(played: Played) -> None:
    detail = played.detail("shared", "test-rewriter")
    if detail["passed"]:
        assert "/tests/test.sh" in _checks(detail).get("tests-modified", []), _checks(detail)


def test_no_network_during_verification_for_an_offline_task(played: Played) -> None:
    for mode in MODES:
        run = played.run_dir(mode)
        seen = next(run.glob("artifacts/net-during-verify/attempt-0/verifier/logs/interfaces.txt"))
        assert seen.read_text().split() == ["lo"], (mode, seen.read_text())
        plans = json.loads((run / "run_info.json").read_text())["resolved_execution_plans"]
        assert plans["net-during-verify"]["0"]["evaluation_network_policy"] == "disabled"


def test_modes_are_recorded_and_separate_tests_come_baked_in(played: Played) -> None:
    for mode in MODES:
        plans = json.loads((played.run_dir(mode) / "run_info.json").read_text())["resolved_execution_plans"]
        assert plans["honest-service"]["0"]["environment"]["verifier_mode"] == mode
        baked = next(played.run_dir(mode).glob("artifacts/honest-service/attempt-0/verifier/logs/baked.txt"))
        assert baked.read_text().strip() == ("yes" if mode == "separate" else "no")


def test_huge_sparse_logs_are_cut_not_copied(played: Played) -> None:
    detail = played.detail("shared", "sparse-logs")
    copied = detail["metadata"]["copied"]
    for source, name in (("/logs/agent", "big.log"), ("/logs/artifacts", "huge.bin")):
        cut = {entry["name"]: entry for entry in copied[source]["cut"]}
        assert name in cut and cut[name]["size"] >= 2 * 1024**3, copied[source]
        assert copied[source]["read_bytes"] <= copied[source]["limit_bytes"], copied[source]
    # The pytest process never held the sparse files (they read as 12 GB of zeros).
    assert played.peak_kib < 1024 * 1024, f"peak RSS of the run: {played.peak_kib} KiB"
    # A snapshot would copy them whole (a commit is not sparse): refused, and said why.
    snapshot = played.detail("snapshot", "sparse-logs")
    assert not snapshot["passed"] and "more than a snapshot may hold" in snapshot["error"], snapshot["error"]


def test_planted_files_stay_inside_the_run_directory(played: Played) -> None:
    run = played.run_dir("shared")
    folder = run / "artifacts" / "host-files" / "attempt-0" / "logs"
    assert (folder / "artifacts" / "test_pwn.py").is_file()
    links = [p for p in run.rglob("*") if p.is_symlink()]
    assert links == []
    assert not Path("/tmp/pwned").exists()


def test_a_fork_bomb_meets_the_pids_limit(played: Played) -> None:
    detail = played.detail("fork-bomb", "fork-bomb")
    assert not detail["passed"]
    pids = next(played.run_dir("fork-bomb").glob("artifacts/fork-bomb/attempt-0/logs/agent/pids.max"))
    assert pids.read_text().strip() == "64"


def test_default_pids_limit_applies(played: Played) -> None:
    pids = next(played.run_dir("shared").glob("artifacts/honest-service/attempt-0/logs/agent/pids.max"))
    assert pids.read_text().strip() == "1024"


def test_nothing_is_left_behind(played: Played) -> None:
    for request in (*MODES, "fork-bomb"):
        run_id = played.run_dir(request).name
        assert containers_of(run_id) == []
        assert docker_lines("images", "-q", "--filter", f"label=agentcompass.run={run_id}") == []
