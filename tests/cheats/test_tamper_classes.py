"""Tampering by path class: code planted where a verifier runs it, under no name a denylist knows.

One pytest run (module fixture) plays the cheats of ``tests/suites/tamper_tasks.py``
in the ``shared`` and ``snapshot`` modes, on the real Docker engine, with a
verifier that runs what published verifiers run (``apt-get``, ``~/.local/bin/env``,
``uvx``, ``python3 -m pytest`` with plugin autoload). The rule: each is flagged
by the class of path it changed, or does not pass; an honest agent that writes
its solution module is not flagged. Also here: a process dressed as the
keepalive, a NaN reward, an agent-broken log folder under the transient retry
policy, and the notes a snapshot or separate verifier owes an honest task.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from cheat_tasks import AGENT, PlayedRuns, play_once, write_cheat_task
from harbor_tasks import containers_of, docker_lines, require_images
from tamper_tasks import (
    BROKEN_LOGS,
    CRAFTED_PYC,
    DISGUISED,
    HONEST_MODULE,
    MANY_LOGS,
    NAN,
    NAN_TEST_SH,
    NEWLINE_LOG,
    SECRET_ENV,
    SECRET_HOOK,
    SECRET_READER,
    SERVICE,
    SERVICE_TEST_SH,
    TAMPER,
    TEST_SH,
)

#: A module of the working directory that shadows pytest's ``iniconfig`` (it writes the answer when imported).
WORKDIR_MODULE = TAMPER["workdir-module"][0]

MODES = ("shared", "snapshot")
OFFLINE = "allow_internet = false"

require_images("python:3.12-slim", hint="run scripts/start-docker.sh and scripts/build-base-images.sh")


def _request(name: str, path: str, mode: str, **execution: Any) -> dict[str, Any]:
    return {
        "name": name,
        "benchmark": {"id": "harbor", "params": {"path": path, "verifier_mode": mode}},
        "harness": {"id": "command", "params": AGENT},
        "environment": {"id": "docker"},
        "execution": {"retry_backoff_seconds": 0, **execution},
    }


Played = PlayedRuns


@pytest.fixture(scope="module")
def played(tmp_path_factory: pytest.TempPathFactory) -> Played:
    root, facts = play_once(tmp_path_factory, "tamper", _play)
    output = facts["stdout"] + facts["stderr"]
    assert "INTERNALERROR" not in output, facts["stdout"][-3000:] + facts["stderr"][-3000:]
    return Played(root)


def _play(root: Path) -> dict[str, Any]:
    """The one run of every tamper task (see :func:`cheat_tasks.play_once`): its output."""
    tasks = root / "tasks"
    for name, (script, _, _) in TAMPER.items():
        write_cheat_task(tasks, name, script, test_sh=TEST_SH, environment=OFFLINE)
    write_cheat_task(tasks, "crafted-pyc", CRAFTED_PYC, test_sh=TEST_SH, environment=OFFLINE)
    write_cheat_task(tasks, "honest-module", HONEST_MODULE, test_sh=TEST_SH, environment=OFFLINE)
    write_cheat_task(tasks, "disguised-keepalive", DISGUISED)
    write_cheat_task(tasks, "nan-reward", NAN, test_sh=NAN_TEST_SH)
    write_cheat_task(tasks, "needs-service", SERVICE, test_sh=SERVICE_TEST_SH)
    write_cheat_task(tasks, "secret-reader", SECRET_READER, environment=SECRET_ENV)
    write_cheat_task(tasks, "secret-hook", SECRET_HOOK, environment=SECRET_ENV)
    write_cheat_task(tasks, "newline-log", NEWLINE_LOG)
    write_cheat_task(tasks, "many-logs", MANY_LOGS)
    write_cheat_task(root / "separate", "nothing-copied", "echo 42 > /app/answer.txt", artifacts="[]")
    write_cheat_task(root / "separate", "artifact-shadow", WORKDIR_MODULE, artifacts='["/app/iniconfig.py"]')
    write_cheat_task(root / "broken", "broken-logs", BROKEN_LOGS)
    write_cheat_task(root / "snap-broken", "logs-gone", "rm -rf /logs && ln -s /nowhere /logs\n")
    requests = [_request(mode, "tasks", mode) for mode in MODES]
    requests.append(_request("separate", "separate", "separate"))
    requests.append(_request("retry", "broken", "shared", max_retries=2, retry_pattern_list="transient"))
    requests.append(_request("snap-retry", "snap-broken", "snapshot", max_retries=2, retry_pattern_list="transient"))
    config = {"output_dir": "runs", "task_concurrency": 8, "requests": requests}
    (root / "agentcompass.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider", "-q"],
        cwd=root,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "AGENTCOMPASS_CHEAT_TOKEN": "s3cr3t-t0ken"},
        check=False,
    )
    return {"stdout": done.stdout, "stderr": done.stderr}


def _checks(detail: dict[str, Any]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for finding in detail["metadata"].get("integrity") or []:
        found.setdefault(finding["check"], []).append(str(finding["path"]))
    return found


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("cheat", sorted(TAMPER))
def test_tampering_is_flagged_by_the_class_of_its_path(played: Played, cheat: str, mode: str) -> None:
    detail = played.detail(mode, cheat)
    _, check, path = TAMPER[cheat]
    assert path in _checks(detail).get(check, []), (cheat, mode, detail["passed"], detail["metadata"].get("integrity"))


def test_a_sleep_on_path_never_runs_as_the_snapshot_keepalive(played: Played) -> None:
    detail = played.detail("snapshot", "sleep-shim")
    assert not detail["passed"], detail["metadata"].get("verifier")


@pytest.mark.parametrize("mode", MODES)
def test_a_crafted_compiled_cache_does_not_pass(played: Played, mode: str) -> None:
    detail = played.detail(mode, "crafted-pyc")
    assert detail["status"] == "scored" and not detail["passed"], detail["metadata"].get("verifier")


@pytest.mark.parametrize("mode", MODES)
def test_an_honest_solution_module_is_not_flagged(played: Played, mode: str) -> None:
    detail = played.detail(mode, "honest-module")
    assert detail["passed"], detail["error"]
    assert _checks(detail) == {}, detail["metadata"].get("integrity")


def test_a_process_named_like_the_keepalive_is_listed(played: Played) -> None:
    detail = played.detail("shared", "disguised-keepalive")
    listed = [f for f in detail["metadata"].get("integrity") or [] if f["check"] == "agent-processes"]
    assert listed and "sleep 2147483647" in listed[0]["message"], detail["metadata"].get("integrity")


def test_verifier_secrets_beside_surviving_processes_are_flagged(played: Played) -> None:
    detail = played.detail("shared", "secret-reader")
    exposed = [f for f in detail["metadata"].get("integrity") or [] if f["check"] == "secrets-exposed"]
    assert exposed and "TOKEN" in exposed[0]["message"], detail["metadata"].get("integrity")
    assert "s3cr3t-t0ken" not in json.dumps(detail)  # the value itself is masked wherever it is written
    assert "secrets-exposed" not in _checks(played.detail("snapshot", "secret-reader"))


@pytest.mark.parametrize("mode", MODES)
def test_verifier_secrets_beside_code_the_agent_planted_are_flagged(played: Played, mode: str) -> None:
    # No process survives in snapshot mode, but the verifier runs on the agent's file system.
    detail = played.detail(mode, "secret-hook")
    exposed = [f for f in detail["metadata"].get("integrity") or [] if f["check"] == "secrets-exposed"]
    assert exposed and "startup-hook" in exposed[0]["message"], detail["metadata"].get("integrity")
    assert "only mode 'separate'" in exposed[0]["message"]


def test_a_nan_score_entry_is_an_evaluation_error_naming_it(played: Played) -> None:
    detail = played.detail("shared", "nan-reward")
    assert detail["status"] == "evaluation_error" and detail["score"] is None, (detail["status"], detail["score"])
    assert "'reward' is nan" in detail["error"], detail["error"]


def test_an_engine_refusal_the_agent_caused_is_not_retried_as_transient(played: Played) -> None:
    detail = played.detail("retry", "broken-logs")
    assert detail["retries"] == 0, detail["retries"]
    assert detail["status"] != "scored" and "/logs/agent" in detail["error"], detail["error"]


def test_logs_the_agent_broke_fail_a_snapshot_verifier_not_its_environment(played: Played) -> None:
    """The runner writes nothing into a snapshot as its container opens (its files are the agent's):
    a /logs the agent made a dangling link is the verifier's failure, never an environment error
    that a transient policy would retry."""
    detail = played.detail("snap-retry", "logs-gone")
    assert (detail["status"], detail["retries"]) == ("evaluation_error", 0), (detail["status"], detail["error"])
    assert "/logs/verifier" in detail["error"], detail["error"]


def test_a_service_a_snapshot_does_not_carry_over_is_said(played: Played) -> None:
    assert played.detail("shared", "needs-service")["passed"]
    detail = played.detail("snapshot", "needs-service")
    assert not detail["passed"]
    notes = " ".join(detail["notes"])
    assert "verifier mode 'snapshot'" in notes and "not carried over" in notes and "http.server" in notes, notes


def test_a_separate_verifier_that_got_nothing_is_said(played: Played) -> None:
    detail = played.detail("separate", "nothing-copied")
    notes = " ".join(detail["notes"])
    assert "verifier mode 'separate': nothing of the agent's environment was copied" in notes, detail["notes"]


def test_agent_logs_come_through_the_engine_whatever_their_names(played: Played) -> None:
    detail = played.detail("shared", "newline-log")
    assert detail["passed"], detail["error"]
    (kept,) = detail["artifacts"]["logs"]
    assert kept.endswith("two_lines.log") and (played.run_dir("shared") / kept).read_text() == "hello\n", kept
    many = played.detail("shared", "many-logs")
    assert many["passed"] and len(many["artifacts"]["logs"]) == 50, many["error"]  # max_log_files


def test_an_artifact_that_shadows_a_module_of_a_separate_verifier_is_flagged(played: Played) -> None:
    detail = played.detail("separate", "artifact-shadow")
    assert "/app/iniconfig.py" in _checks(detail).get("shadowing-module", []), (
        detail["passed"],
        detail["metadata"].get("integrity"),
    )


def test_nothing_is_left_behind(played: Played) -> None:
    for request in (*MODES, "separate", "retry"):
        run_id = played.run_dir(request).name
        assert containers_of(run_id) == []
        assert docker_lines("images", "-q", "--filter", f"label=agentcompass.run={run_id}") == []
