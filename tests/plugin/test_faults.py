"""Faults a user can cause end in one clear message: never INTERNALERROR, a deep traceback or silence."""

from __future__ import annotations

import json
import os
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import tracing_request, write_config

HEAD = """
import dataclasses, logging
from pytest_agentcompass import HarnessFreeBenchmark, LocalEnvironment, PreflightError, RunResult, TaskSpec
"""


def bench_request(
    pytester: pytest.Pytester,
    body: str,
    cls: str = "B",
    benchmark_params: dict[str, Any] | None = None,
    **request: Any,
) -> dict[str, Any]:
    pytester.makepyfile(bench=HEAD + body)
    benchmark: dict[str, Any] = {"id": f"bench.py:{cls}", **({"params": benchmark_params} if benchmark_params else {})}
    return {"name": "r", "benchmark": benchmark, **request}


def run(pytester: pytest.Pytester, requests: list[dict[str, Any]], *args: str, **top: Any) -> pytest.RunResult:
    write_config(pytester, requests, **top)
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider", *args)
    out = result.stdout.str() + result.stderr.str()
    assert result.ret != pytest.ExitCode.INTERNAL_ERROR and "INTERNALERROR" not in out, out
    return result


def strict_json(path: Path) -> Any:
    def refuse(name: str) -> Any:
        raise ValueError(f"{path} holds {name}, which is not JSON")

    return json.loads(path.read_text(), parse_constant=refuse)


ANSWERS = """
class B(HarnessFreeBenchmark):
    def load_tasks(self, req):
        return [TaskSpec(f"t{i}") for i in range(3)]
    def run_task(self, task, prepared, env, req, plan):
        return RunResult(task.task_id, output="x")
    def evaluate(self, task, prepared, result, req, plan, env=None):
        return dataclasses.replace(result, score=1.0)
"""


def test_make_benchmark_plan_raising_is_a_clear_error_and_releases_the_run(pytester: pytest.Pytester) -> None:
    body = (
        ANSWERS
        + """
    def make_benchmark_plan(self, task, req):
        raise ValueError("no plan for " + task.task_id)
"""
    )
    result = run(pytester, [bench_request(pytester, body)])
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(errors=3)
    result.stdout.fnmatch_lines(["*make_benchmark_plan*ValueError: no plan for t0*"])
    (run_dir,) = (pytester.path / "runs/r").iterdir()
    assert json.loads((run_dir / "run_info.json").read_text())["status"] != "created"
    assert not (run_dir / "run.lock").exists()


@pytest.mark.parametrize(
    ("hook", "message"),
    [
        (
            "async def make_benchmark_plan(self, task, req):\n        return self.later()\n"
            "    async def later(self):\n        return {}",
            "*planning attempt 0 failed: make_benchmark_plan returned a coroutine, not plan data*",
        ),
        (
            "def adjust_plan(self, plan, task, req):\n        dataclasses.replace(plan, timeouts={})",
            "*planning attempt 0 failed: adjust_plan returned None, not an ExecutionPlan*",
        ),
        # Its exception did not name it.
        (
            "def adjust_plan(self, plan, task, req):\n        raise ValueError('no room for ' + task.task_id)",
            "*planning attempt 0 failed: adjust_plan raised ValueError: no room for t0*",
        ),
        # The config refuses these; from the hook, -5 timed every run out at once.
        (
            "def adjust_plan(self, plan, task, req):\n"
            "        return dataclasses.replace(plan, timeouts={**plan.timeouts, 'run': -5})",
            "*planning attempt 0 failed: adjust_plan set timeouts?'run'? to -5; a timeout is a positive number*",
        ),
    ],
    ids=["make_benchmark_plan", "adjust_plan", "adjust_plan-raises", "adjust_plan-negative-timeout"],
)
def test_a_planning_hook_that_returns_no_plan_is_named(pytester: pytest.Pytester, hook: str, message: str) -> None:
    # Was recorded as the plan ("<coroutine object ...>"), or an AttributeError deep in the planner.
    result = run(pytester, [bench_request(pytester, ANSWERS + "    " + hook + "\n")], "-W", "error::RuntimeWarning")
    result.assert_outcomes(errors=3)
    result.stdout.fnmatch_lines([message])
    if "raise ValueError" in hook:  # and its trace is the hook's
        result.stdout.fnmatch_lines(["*, in adjust_plan", "*raise ValueError('no room for ' + task.task_id)"])
    assert "never awaited" not in result.stdout.str() + result.stderr.str()


@pytest.mark.parametrize("status", ["inference_error", "environment_error"])
def test_a_plain_string_status_is_accepted(pytester: pytest.Pytester, status: str) -> None:
    body = ANSWERS.replace('output="x")', f'status="{status}", error="quota exceeded")')
    result = run(pytester, [bench_request(pytester, body)])
    result.assert_outcomes(errors=3)
    # An infrastructure fault is the runtime's word: a component claiming one is recorded as its stage's error.
    result.stdout.fnmatch_lines(["inference_error in the inference_result stage: quota exceeded"])
    (run_dir,) = (pytester.path / "runs/r").iterdir()
    metadata = json.loads((run_dir / "details/t0.json").read_text())["metadata"]
    assert metadata.get("returned_status") == (None if status == "inference_error" else status)


def test_an_unknown_status_names_the_valid_ones(pytester: pytest.Pytester) -> None:
    body = ANSWERS.replace('output="x")', 'status="oops")')
    result = run(pytester, [bench_request(pytester, body)])
    result.assert_outcomes(errors=3)
    result.stdout.fnmatch_lines(["*RunResult status 'oops' is not one of completed, scored, *"])


@pytest.mark.parametrize("score", ["float('nan')", "float('inf')", "'high'", "10**400"])
def test_a_non_finite_score_is_an_evaluation_error(pytester: pytest.Pytester, score: str) -> None:
    body = ANSWERS.replace("score=1.0", f"score={score}")
    result = run(pytester, [bench_request(pytester, body)])
    result.assert_outcomes(errors=3)
    result.stdout.fnmatch_lines(["evaluation_error in the evaluation stage: evaluate returned a score*"])
    (run_dir,) = (pytester.path / "runs/r").iterdir()
    summary = strict_json(run_dir / "summary.json")
    assert {t["status"] for t in summary["tasks"]} == {"evaluation_error"}
    strict_json(run_dir / "details/t0.json")


@pytest.mark.parametrize(
    ("tasks", "message"),
    [
        ("None", "*request 'r': load_tasks returned None*"),
        ("[TaskSpec(7)]", "*request 'r': task #0 has task_id 7 (an int); task ids are strings*"),
    ],
)
def test_bad_task_lists_are_named(pytester: pytest.Pytester, tasks: str, message: str) -> None:
    body = ANSWERS.replace('[TaskSpec(f"t{i}") for i in range(3)]', tasks)
    result = run(pytester, [bench_request(pytester, body)])
    assert result.ret == pytest.ExitCode.INTERRUPTED  # a collection error
    result.stdout.fnmatch_lines([message])
    assert "_pytest" not in result.stdout.str()


def test_no_tasks_says_why(pytester: pytest.Pytester) -> None:
    body = ANSWERS.replace('[TaskSpec(f"t{i}") for i in range(3)]', "[]")
    result = run(pytester, [bench_request(pytester, body)])
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    result.stdout.fnmatch_lines(["*request 'r': load_tasks returned no tasks*"])


ARTIFACTS = """
class B(HarnessFreeBenchmark):
    def load_tasks(self, req):
        return [TaskSpec("bin"), TaskSpec("obj")]
    def run_task(self, task, prepared, env, req, plan):
        if task.task_id == "bin":
            return RunResult(task.task_id, artifacts={"file": {"out.png": b"\\x89PNG\\x00"}}, metadata={"raw": [b"ab"]})
        return RunResult(task.task_id, metadata={"client": object()})
    def evaluate(self, task, prepared, result, req, plan, env=None):
        return dataclasses.replace(result, score=1.0)
"""


def test_bytes_go_to_files_and_other_objects_are_named(pytester: pytest.Pytester) -> None:
    result = run(pytester, [bench_request(pytester, ARTIFACTS)])
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*metadata[[]'client'[]] holds a value of type object, not storable as JSON*"])
    (run_dir,) = (pytester.path / "runs/r").iterdir()
    detail = strict_json(run_dir / "details/bin.json")
    ref = detail["artifacts"]["file"]["out.png"]
    assert ref == {"bytes_file": "blobs/bin/artifacts/file/out.png", "size": 5}
    assert (run_dir / ref["bytes_file"]).read_bytes() == b"\x89PNG\x00"
    assert (run_dir / detail["metadata"]["raw"][0]["bytes_file"]).read_bytes() == b"ab"


PREFLIGHT = """
import os

class P(LocalEnvironment):
    async def preflight(self):
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


@pytest.mark.parametrize(
    ("returned", "message"),
    [
        ("None", "*metrics: error=aggregate_metrics returned NoneType, not a mapping of metric names to values*"),
        (
            "{'acc': float('nan'), 'obj': object(), 'n': 3}",
            "*metrics: acc=None, obj=None, n=3, error=aggregate_metrics: 'acc' is nan; 'obj' is a object*",
        ),
    ],
)
def test_aggregate_metrics_answers_that_are_not_metrics_are_named(
    pytester: pytest.Pytester, returned: str, message: str
) -> None:
    body = (
        ANSWERS
        + f"""
    def aggregate_metrics(self, results, req):
        return {returned}
"""
    )
    result = run(pytester, [bench_request(pytester, body)])
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines([message])
    (run_dir,) = (pytester.path / "runs/r").iterdir()
    assert "error" in strict_json(run_dir / "summary.json")["metrics"]
    assert not (run_dir / "run.lock").exists()


def test_a_result_for_another_task_is_an_error(pytester: pytest.Pytester) -> None:
    body = ANSWERS.replace('RunResult(task.task_id, output="x")', 'RunResult("other", output="x")')
    result = run(pytester, [bench_request(pytester, body)])
    result.assert_outcomes(errors=3)
    result.stdout.fnmatch_lines(["*inference stage returned a RunResult whose task_id is 'other', not 't0'*"])
    (run_dir,) = (pytester.path / "runs/r").iterdir()
    assert json.loads((run_dir / "details/t1.json").read_text())["task_id"] == "t1"


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        # Was an internal error ("'list' object is not a mapping") and no detail written.
        ("[1, 2]", "metadata is a list, not a dict"),
        # Were RecursionErrors called inference errors of the "general" stage.
        (
            "(lambda d: d.update(me=d) or d)({})",
            "metadata nests deeper than 100 levels (does it contain itself?) at metadata*",
        ),
        (
            "{'k': functools.reduce(lambda inner, _: [inner], range(100_000), [])}",
            "metadata nests deeper than 100 levels*",
        ),
        # Was written as a bare NaN: the detail file was no JSON a strict reader takes.
        ("{'stats': {'mean': float('nan')}}", "metadata?'stats'??'mean'? is nan, which JSON cannot hold*"),
        ("{'k': [float('-inf')]}", "metadata?'k'??0? is -inf, which JSON cannot hold*"),
    ],
    ids=["list", "circular", "deep", "nan", "infinite"],
)
def test_result_metadata_that_cannot_be_recorded_is_named(
    pytester: pytest.Pytester, metadata: str, message: str
) -> None:
    body = "import functools\n" + ANSWERS.replace('output="x")', f"output='x', metadata={metadata})")
    result = run(pytester, [bench_request(pytester, body)])
    result.assert_outcomes(errors=3)
    result.stdout.fnmatch_lines([f"*inference stage returned a RunResult whose {message}"])
    (run_dir,) = (pytester.path / "runs/r").iterdir()
    assert strict_json(run_dir / "details/t0.json")["status"] == "inference_error"


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


def test_save_artifact_works_from_benchmark_code_too(pytester: pytest.Pytester) -> None:
    """From a HarnessFreeBenchmark's run_task it returned None and wrote nothing: only harnesses had the sink."""
    body = """
from pytest_agentcompass import save_artifact

class B(HarnessFreeBenchmark):
    evaluation_environment_mode = "none"
    def load_tasks(self, req):
        return [TaskSpec("t0"), TaskSpec("t1")]
    async def run_task(self, task, prepared, env, req, plan):
        path = save_artifact("agent/log.txt", "ran " + task.task_id)
        return RunResult(task.task_id, output="x", metadata={"ran": path})
    def collect_artifacts(self, task, prepared, result, env, req, plan):
        path = save_artifact("collected.json", {"task": task.task_id})
        return dataclasses.replace(result, metadata={**result.metadata, "collected": path})
    def evaluate(self, task, prepared, result, req, plan, env=None):
        path = save_artifact("grade.bin", b"\\xff\\x00")
        return dataclasses.replace(result, score=1.0, metadata={**result.metadata, "graded": path})
"""
    result = run(pytester, [bench_request(pytester, body)])
    result.assert_outcomes(passed=2)
    (run_dir,) = (pytester.path / "runs/r").iterdir()
    for task in ("t0", "t1"):
        metadata = strict_json(run_dir / f"details/{task}.json")["attempt_results"]["0"]["metadata"]
        folder = f"artifacts/{task}/attempt-0"
        assert metadata == {
            "ran": f"{folder}/agent/log.txt",
            "collected": f"{folder}/collected.json",
            "graded": f"{folder}/grade.bin",
        }
        assert (run_dir / metadata["ran"]).read_text() == f"ran {task}"
        assert json.loads((run_dir / metadata["collected"]).read_text()) == {"task": task}
        assert (run_dir / metadata["graded"]).read_bytes() == b"\xff\x00"


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


def test_an_evaluation_retried_saves_its_artifacts_apart(pytester: pytest.Pytester) -> None:
    """A retried evaluate (mode none: the evaluation alone is redone) wrote over the first try's files."""
    body = """
import os
from pytest_agentcompass import save_artifact

class B(HarnessFreeBenchmark):
    evaluation_environment_mode = "none"
    def load_tasks(self, req):
        return [TaskSpec("t0")]
    def run_task(self, task, prepared, env, req, plan):
        return RunResult(task.task_id, output="x")
    def evaluate(self, task, prepared, result, req, plan, env=None):
        first = not os.path.exists("evaluated")
        save_artifact("grade.txt", "first try" if first else "second try")
        if first:
            open("evaluated", "w").close()
            raise ConnectionError("the grader dropped the connection")
        return dataclasses.replace(result, score=1.0)
"""
    request = bench_request(pytester, body, execution={"max_retries": 1, "retry_backoff_seconds": 0})
    run(pytester, [request]).assert_outcomes(passed=1)
    (run_dir,) = (pytester.path / "runs/r").iterdir()
    assert (run_dir / "artifacts/t0/attempt-0/grade.txt").read_text() == "first try"
    assert (run_dir / "artifacts/t0/attempt-0-retry-1/grade.txt").read_text() == "second try"


def test_an_infinite_timeout_is_no_limit(pytester: pytest.Pytester) -> None:
    """The config takes `.inf`; the check of what adjust_plan sets refused it although the hook changed nothing."""
    request = bench_request(pytester, ANSWERS, execution={"timeouts": {"run": float("inf")}})
    run(pytester, [request]).assert_outcomes(passed=3)
