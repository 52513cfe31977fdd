"""The plugin's hooks fire from one place however tasks run; prints and categories land where users look."""

from __future__ import annotations

import json
import textwrap
from collections import Counter
from pathlib import Path

import pytest

BENCH = """
import dataclasses
from pytest_agentcompass import HarnessFreeBenchmark, PreparedTask, RunResult, TaskSpec


class Echo(HarnessFreeBenchmark):
    def __init__(self, n=3):
        self.n = n

    def load_tasks(self, req):
        return [
            TaskSpec(task_id=f"e{i}", question=str(i), ground_truth="0", category="odd one" if i % 2 else "even")
            for i in range(self.n)
        ]

    def prepare_task(self, task, env, req, plan):
        return PreparedTask(task_id=task.task_id, prompt=task.question)

    async def run_task(self, task, prepared, env, req, plan):
        print(f"thinking about {task.task_id} out loud")
        return RunResult(task_id=task.task_id, output=task.question)

    def evaluate(self, task, prepared, result, req, plan, env=None):
        return dataclasses.replace(result, score=float(result.output == task.ground_truth))
"""

CONFTEST = """
import json, os

def pytest_agentcompass_task_finished(item, outcome):
    with open(os.environ["HOOK_LOG"], "a") as fh:
        line = {"hook": "task", "task": outcome.task.task_id, "carried_over": outcome.carried_over}
        fh.write(json.dumps(line) + "\\n")

def pytest_agentcompass_request_finalized(request, summary):
    with open(os.environ["HOOK_LOG"], "a") as fh:
        fh.write(json.dumps({"hook": "request", "request": request, "summary": summary}) + "\\n")
"""


@pytest.fixture
def suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Path:
    log = pytester.path / "hooks.jsonl"
    monkeypatch.setenv("HOOK_LOG", str(log))
    pytester.makepyfile(bench=BENCH)
    pytester.makeconftest(CONFTEST)
    (pytester.path / "agentcompass.yaml").write_text(
        textwrap.dedent(
            """
            output_dir: runs
            requests:
              - name: r
                benchmark: {id: "bench.py:Echo", params: {n: 3}}
            """
        )
    )
    return log


def calls(log: Path) -> list[dict[str, object]]:
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    log.unlink()
    return lines


def check(lines: list[dict[str, object]], *, carried_over: bool) -> None:
    tasks = Counter(str(c["task"]) for c in lines if c["hook"] == "task")
    assert tasks == {"e0": 1, "e1": 1, "e2": 1}
    assert all(c["carried_over"] is carried_over for c in lines if c["hook"] == "task")
    (request,) = [c for c in lines if c["hook"] == "request"]
    summary = request["summary"]
    assert isinstance(summary, dict)
    assert [(t["task_id"], t["passed"]) for t in summary["tasks"]] == [("e0", True), ("e1", False), ("e2", False)]
    assert summary["counts"]["tasks"] == 3


def test_hooks_fire_in_process_for_run_and_carried_over_tasks(pytester: pytest.Pytester, suite: Path) -> None:
    pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml").assert_outcomes(passed=1, failed=2)
    check(calls(suite), carried_over=False)
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "--agentcompass-carry-over=latest")
    result.assert_outcomes(passed=1, failed=2)
    check(calls(suite), carried_over=True)


def test_hooks_fire_under_xdist(pytester: pytest.Pytester, suite: Path) -> None:
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-n", "2")
    result.assert_outcomes(passed=1, failed=2)
    check(calls(suite), carried_over=False)


def test_print_in_a_task_goes_to_its_report(pytester: pytest.Pytester, suite: Path) -> None:
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-rA")
    result.assert_outcomes(passed=1, failed=2)
    text = result.stdout.str()
    # Shown in the task's own section, never loose between the progress characters.
    result.stdout.fnmatch_lines(["*Captured stdout call*", "thinking about e1 out loud"])
    before_sections = text.split("====")[0]
    assert "thinking about" not in before_sections
    assert text.count("thinking about e1 out loud") == 1


def test_categories_are_listed_by_markers(pytester: pytest.Pytester, suite: Path) -> None:
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "--markers")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["@pytest.mark.even: agentcompass task category 'even'"])
    result.stdout.fnmatch_lines(["@pytest.mark.odd_one: agentcompass task category 'odd one'"])
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "--strict-markers", "-m", "odd_one")
    result.assert_outcomes(failed=1, deselected=2)


@pytest.mark.parametrize("xdist", [(), ("-n", "2")], ids=["in-process", "xdist"])
def test_a_request_stopped_by_exitfirst_is_finalized_with_its_hook_and_page(
    pytester: pytest.Pytester, suite: Path, xdist: tuple[str, ...]
) -> None:
    # One task at a time: e1 fails, -x stops the run, e2 never starts (under xdist it may have).
    args = ("--agentcompass=agentcompass.yaml", "-x", "--agentcompass-concurrency=1", *xdist)
    result = pytester.runpytest_subprocess(*args)
    result.stdout.fnmatch_lines(["*stopping after * failures*"])
    (request,) = [c for c in calls(suite) if c["hook"] == "request"]
    summary = request["summary"]
    assert isinstance(summary, dict) and summary["status"] == "stopped"
    (run_dir,) = (pytester.path / "runs/r").iterdir()
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "stopped"
    assert (run_dir / "report.html").is_file()
