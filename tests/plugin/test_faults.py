"""Faults a benchmark can cause end in one clear message: never INTERNALERROR, a deep traceback or silence."""

from __future__ import annotations

import json

import pytest

from faults import ANSWERS, bench_request, run, strict_json


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
        detail = strict_json(run_dir / f"details/{task}.json")
        assert "metadata" in detail["attempt_results"]["0"]["same_as_task"]  # one attempt: stored once
        metadata = {k: v for k, v in detail["metadata"].items() if k not in ("attempts", "attempt_scores")}
        folder = f"artifacts/{task}/attempt-0"
        assert metadata == {
            "ran": f"{folder}/agent/log.txt",
            "collected": f"{folder}/collected.json",
            "graded": f"{folder}/grade.bin",
        }
        assert (run_dir / metadata["ran"]).read_text() == f"ran {task}"
        assert json.loads((run_dir / metadata["collected"]).read_text()) == {"task": task}
        assert (run_dir / metadata["graded"]).read_bytes() == b"\xff\x00"


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


def test_a_huge_error_is_cut_in_the_terminal_and_junit_and_bounded_in_the_detail(pytester: pytest.Pytester) -> None:
    # A 10 MB exception message reached the terminal (twice: message and trace) and each junit <error> whole.
    body = ANSWERS.replace(
        "        return dataclasses.replace(result, score=1.0)",
        "        raise ValueError('head-' + 'x' * 10_000_000 + '-tail')",
    )
    result = run(pytester, [bench_request(pytester, body)], "--junitxml=junit.xml")
    result.assert_outcomes(errors=3)
    out = result.stdout.str()
    assert len(out) < 300_000, len(out)
    result.stdout.fnmatch_lines(["*ValueError: head-xxx*", "*characters not shown*full text is in the detail file*"])
    junit = (pytester.path / "junit.xml").read_text()
    assert len(junit) < 300_000, len(junit)
    assert "characters not shown" in junit
    (run_dir,) = (pytester.path / "runs/r").iterdir()
    detail = json.loads((run_dir / "details/t0.json").read_text())
    assert detail["error"].startswith("ValueError: head-") or "head-" in detail["error"]
    assert len(detail["error"]) < 1_100_000
    assert detail["error"].endswith("-tail")


def test_a_huge_load_error_is_cut_in_the_terminal(pytester: pytest.Pytester) -> None:
    body = ANSWERS.replace(
        '        return [TaskSpec(f"t{i}") for i in range(3)]',
        "        raise ValueError('head-' + 'x' * 10_000_000 + '-tail')",
    )
    result = run(pytester, [bench_request(pytester, body)], "--junitxml=junit.xml")
    assert result.ret != pytest.ExitCode.OK
    out = result.stdout.str() + result.stderr.str()
    assert len(out) < 300_000, len(out)
    assert "characters not shown" in out
    assert len((pytester.path / "junit.xml").read_text()) < 300_000
