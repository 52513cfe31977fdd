"""Faults around the tasks end in one clear message: a failed preflight, an unusable run directory,
a bad run id or config path, a request that fails to close."""

from __future__ import annotations

import json
import os
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import tracing_request, write_config
from faults import ANSWERS, bench_request, run

PREFLIGHT = """
import os

class P(LocalEnvironment):
    async def preflight(self):
        raise PreflightError("the engine at tcp://nowhere refused the token " + os.environ["ENGINE_TOKEN"])
"""

#: The same, in the xdist workers alone (the controller's own preflight passes).
PREFLIGHT_ON_WORKERS = """
import os

class P(LocalEnvironment):
    async def preflight(self):
        if os.environ.get("PYTEST_XDIST_WORKER"):
            raise PreflightError("the engine at tcp://nowhere refused the token " + os.environ["ENGINE_TOKEN"])
"""


def junit_errors(path: Path) -> list[tuple[str, str]]:
    """(message, text) of every ``<error>`` in a junit file."""
    return [(e.get("message", ""), e.text or "") for e in ET.parse(path).getroot().iter("error")]


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["in-process", "xdist"])
def test_a_preflight_failure_is_printed_once_and_carried_by_junit(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, workers: list[str]
) -> None:
    # junit only said "the reason is in the agentcompass summary", which a CI page of test cases does not show.
    monkeypatch.setenv("ENGINE_TOKEN", "tok-0123456789")
    params = {"token": "${ENGINE_TOKEN}"}  # a ${VAR} value: the run masks it everywhere
    request = bench_request(pytester, ANSWERS + PREFLIGHT, environment={"id": "bench.py:P"}, benchmark_params=params)
    result = run(pytester, [request], "--junitxml=j.xml", *workers)
    result.assert_outcomes(errors=3)
    assert result.stdout.str().count("tcp://nowhere refused the token ***") == 1  # in the summary alone
    result.stdout.fnmatch_lines(
        ["*not run: request 'r' failed its preflight (the reason is in the agentcompass summary)*"]
    )
    result.stdout.fnmatch_lines(["r: 3 tasks, 0 passed, 0 failed, 3 errors (3 environment)", "  *tcp://nowhere*"])
    errors = junit_errors(pytester.path / "j.xml")
    assert len(errors) == 3
    reason = "reason: request 'r': the engine at tcp://nowhere refused the token ***"
    assert all(reason in message and reason in text for message, text in errors), errors
    assert "tok-0123456789" not in result.stdout.str() + (pytester.path / "j.xml").read_text()


def test_a_preflight_that_fails_on_the_workers_alone_is_named_in_the_summary(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The controller's preflight passed: its summary said the tasks "ended without a result (a worker
    # was lost)", while each task pointed at that summary for a reason it never gave.
    monkeypatch.setenv("ENGINE_TOKEN", "tok-0123456789")
    # Under the suite's own -n, this process is a worker: the run's controller must not look like one.
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    params = {"token": "${ENGINE_TOKEN}"}
    request = bench_request(
        pytester, ANSWERS + PREFLIGHT_ON_WORKERS, environment={"id": "bench.py:P"}, benchmark_params=params
    )
    result = run(pytester, [request], "--junitxml=j.xml", "-n", "2")
    result.assert_outcomes(errors=3)
    result.stdout.fnmatch_lines(
        [
            "*not run: request 'r' failed its preflight (the reason is in the agentcompass summary)*",
            "r: 3 tasks, 0 passed, 0 failed, 3 errors*",
            "  note: *3 task(s) not run: on one of the xdist workers, request 'r': the engine at tcp://nowhere "
            "refused the token [*][*][*]; the next run resumes it",
        ]
    )
    assert "a worker was lost" not in result.stdout.str()
    assert "tok-0123456789" not in result.stdout.str() + (pytester.path / "j.xml").read_text()


def test_a_bad_evaluation_mode_at_preflight_is_in_each_junit_error(pytester: pytest.Pytester) -> None:
    body = ANSWERS.replace(
        '[TaskSpec(f"t{i}") for i in range(3)]',
        '[TaskSpec(f"t{i}", evaluation_environment_mode="bogus") for i in range(2)]',
    )
    result = run(pytester, [bench_request(pytester, body)], "--junitxml=j.xml")
    result.assert_outcomes(errors=2)
    assert result.stdout.str().count("evaluation mode 'bogus'") == 1
    errors = junit_errors(pytester.path / "j.xml")
    assert len(errors) == 2
    assert all("reason: request 'r': task 't0': evaluation mode 'bogus' is not one of" in m for m, _ in errors), errors


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 64 KiB file system (root only), unmounted afterwards."""
    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(mount: Path) -> None:
    fd = os.open(mount / "ballast", os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:  # ENOSPC: full
        pass
    finally:
        os.close(fd)


@pytest.mark.parametrize("fault", ["file", "read-only", "full"])
def test_an_unusable_output_dir_is_named(pytester: pytest.Pytester, trace: Path, small_disk: Path, fault: str) -> None:
    output = small_disk / "runs"
    if fault == "file":
        output.write_text("not a folder")
    elif fault == "read-only":
        subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    else:
        fill(small_disk)
    result = run(pytester, [tracing_request("r", trace, n=3)], output_dir=str(output))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*cannot write the run directory {output}/r/*"])
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


def test_a_run_directory_filling_up_mid_run_is_named_and_fails_the_session(
    pytester: pytest.Pytester, small_disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = """
import os
class B(HarnessFreeBenchmark):
    def load_tasks(self, req):
        return [TaskSpec("t0"), TaskSpec("t1")]
    def run_task(self, task, prepared, env, req, plan):
        if task.task_id == "t1":  # the disk fills up under the run
            try:
                with open(os.path.join(os.environ["SMALL_DISK"], "ballast"), "wb") as ballast:
                    while True:
                        ballast.write(b"0" * 4096)
                        ballast.flush()
            except OSError:  # full
                pass
        return RunResult(task.task_id, output="x")
    def evaluate(self, task, prepared, result, req, plan, env=None):
        return dataclasses.replace(result, score=1.0)
"""
    monkeypatch.setenv("SMALL_DISK", str(small_disk))
    request = bench_request(pytester, body)
    result = run(pytester, [request], "--junitxml=junit.xml", output_dir=str(small_disk / "runs"), task_concurrency=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "*its detail record could not be written, so a resume runs it again: *No space left on device*",
            "r: 2 tasks, 2 passed, 0 failed, 0 errors",
            "*note: could not write summary.json in *: OSError: *No space left on device*",
        ]
    )
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    assert (pytester.path / "junit.xml").is_file()


@pytest.mark.parametrize("run_id", ["../../escaped", "", "a/b", 123])
def test_a_run_id_that_is_no_folder_name_is_refused(pytester: pytest.Pytester, run_id: object) -> None:
    """The hook's answer was used as a folder name unchecked: "../../escaped" wrote outside output_dir."""
    pytester.makeconftest(f"def pytest_agentcompass_make_run_id(config):\n    return {run_id!r}\n")
    result = run(pytester, [bench_request(pytester, ANSWERS)])
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*pytest_agentcompass_make_run_id returned {run_id!r}; a run id is a folder name*"])
    assert not (pytester.path / "runs").exists() and not (pytester.path.parent / "escaped").exists()


def test_run_directories_under_a_collected_folder_are_never_collected(pytester: pytest.Pytester) -> None:
    """With output_dir under the tests, a test file an agent wrote into its logs ran on the host next time."""
    pytester.makepyfile(test_plain="def test_plain():\n    pass\n")
    request = bench_request(pytester, ANSWERS)
    written = pytester.path / "tests/runs/r/20260101T000000000000-abcd/artifacts/t0/attempt-0/agent/test_agent.py"
    written.parent.mkdir(parents=True)
    written.write_text("open('ran', 'w').close()\ndef test_agent():\n    pass\n")
    write_config(pytester, [request], output_dir="tests/runs")
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider", ".")
    result.assert_outcomes(passed=4)  # three tasks and test_plain
    assert "test_agent" not in result.stdout.str() and not (pytester.path / "ran").exists()


@pytest.mark.parametrize("name", ["we::ird.yaml", "a::b/agentcompass.yaml"])
def test_a_config_path_with_a_node_id_separator_is_refused(pytester: pytest.Pytester, name: str) -> None:
    """It loaded, then pytest split the collected path at '::' and ended with "file or directory not found"."""
    request = bench_request(pytester, ANSWERS)
    (pytester.path / name).parent.mkdir(exist_ok=True)
    write_config(pytester, [request], name=name)
    result = pytester.runpytest_subprocess(f"--agentcompass={name}", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*agentcompass config */{name}: its path contains '::'*rename the file or folder"])
    assert not (pytester.path / "runs").exists()


@pytest.mark.parametrize("xdist", [False, True], ids=["in-process", "xdist"])
def test_a_harness_aclose_that_raises_is_in_the_summary(pytester: pytest.Pytester, xdist: bool) -> None:
    """It was only logged, outside any test: nothing in the terminal showed it."""
    body = """
from pytest_agentcompass import BaseBenchmark
from pytest_agentcompass.harnesses.base import BaseHarness

class B(BaseBenchmark):
    evaluation_environment_mode = "none"
    def load_tasks(self, req):
        return [TaskSpec("t0"), TaskSpec("t1")]
    def evaluate(self, task, prepared, result, req, plan, env=None):
        return dataclasses.replace(result, score=1.0)

class H(BaseHarness):
    def run(self, session, task, prepared, env, req, plan):
        return RunResult(task.task_id, output="x")
    def aclose(self):
        raise RuntimeError("the client pool would not close")
"""
    request = bench_request(pytester, body, harness={"id": "bench.py:H"})
    result = run(pytester, [request], *(["-n", "2"] if xdist else []))
    result.assert_outcomes(passed=2)
    notes = [line for line in result.outlines if "closing the harness failed" in line]
    assert notes == ["  note: closing the harness failed: RuntimeError: the client pool would not close"], notes


SWEEP = """
class S(LocalEnvironment):
    async def sweep(self, run_id):
        raise RuntimeError("the engine that ran " + run_id + " is gone")
"""


@pytest.mark.parametrize(
    ("workers", "outcomes"),
    [([], {"errors": 3}), (["-n", "2"], {"passed": 3})],
    ids=["in-process", "xdist"],
)
def test_a_run_that_cannot_be_prepared_says_why_and_is_recorded_failed(
    pytester: pytest.Pytester, workers: list[str], outcomes: dict[str, int]
) -> None:
    """The sweep of a killed run fails. Under xdist the workers hold the tasks already and run them, but the
    reason is in the summary and the run is recorded failed, as in process (it was dropped, the run left 'running')."""
    killed = pytester.path / "runs" / "r" / "20000101T000000000000-dead"
    killed.mkdir(parents=True)
    info = {"run_id": killed.name, "request": "r", "status": "running", "pid": 2**22 + 7, "started_at": "2000"}
    (killed / "run_info.json").write_text(json.dumps(info))
    request = bench_request(pytester, ANSWERS + SWEEP, environment={"id": "bench.py:S"})
    result = run(pytester, [request], *workers)
    result.assert_outcomes(**outcomes)
    said = [line for line in result.outlines if "preparation failed: RuntimeError: the engine that ran" in line]
    assert len(said) == 1, result.stdout.str()
    (run_dir,) = [p for p in (pytester.path / "runs/r").iterdir() if p != killed]
    assert json.loads((run_dir / "run_info.json").read_text())["status"] == "failed"
