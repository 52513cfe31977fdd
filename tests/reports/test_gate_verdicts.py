"""A gate's verdict under selection: never a printed MISSED with exit 0, never a green --lf unjudged.

A gate judges the whole request: this session's results, and for the tasks
it did not run the newest result an earlier run with the same settings
recorded (carried over). It counts whether or not its item was selected.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from conftest import write_config

RUN = "--agentcompass=agentcompass.yaml"

#: Task t<i> passes once a file ``fixed-t<i>`` exists: the benchmark changes, its config does not.
FIXABLE = """
import dataclasses, os
from pytest_agentcompass import HarnessFreeBenchmark, RunResult, TaskSpec


class Fixable(HarnessFreeBenchmark):
    def load_tasks(self, req):
        return [TaskSpec(f"t{i}", category="odd" if i % 2 else "even") for i in range(4)]

    def run_task(self, task, prepared, env, req, plan):
        here = os.path.dirname(os.path.abspath(__file__))
        return RunResult(task.task_id, output=os.path.exists(os.path.join(here, "fixed-" + task.task_id)))

    def evaluate(self, task, prepared, result, req, plan, env=None):
        return dataclasses.replace(result, score=1.0 if result.output else 0.0)
"""


def fixable(
    pytester: pytest.Pytester, gates: dict[str, Any], fixed: tuple[str, ...] = ("t0", "t2"), **request: Any
) -> None:
    pytester.makepyfile(fixable=FIXABLE)
    for task in fixed:
        (pytester.path / f"fixed-{task}").touch()
    write_config(pytester, [{"name": "a", "benchmark": {"id": "fixable.py:Fixable"}, "gates": gates, **request}])


def summary(pytester: pytest.Pytester) -> dict[str, Any]:
    newest = max((pytester.path / "runs" / "a").iterdir(), key=lambda p: p.name)
    return json.loads((newest / "summary.json").read_text())  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("select", "xdist"),
    [
        (["-k", "t1 or t3"], False),
        (["-m", "odd"], False),
        (["-k", "not gates"], False),
        (["-k", "t1 or t3"], True),
    ],
    ids=["k", "m", "not-gates", "k-n2"],
)
def test_a_missed_gate_fails_the_session_when_its_item_is_not_selected(
    pytester: pytest.Pytester, select: list[str], xdist: bool
) -> None:
    fixable(pytester, {"pass@1": 0.9})
    args = [RUN, "-p", "no:cacheprovider", *select, *(["-n", "2"] if xdist else [])]
    result = pytester.runpytest_subprocess(*args)
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "*gates: MISSED (judged on * of 4 task(s)*",
            "*missed: pass@1 = * is below the minimum 0.9*",
            "*its gate item did not run (not selected): the session fails all the same*",
        ]
    )
    assert summary(pytester)["gates"]["met"] is False


def test_tasks_not_selected_are_judged_from_the_previous_run(pytester: pytest.Pytester) -> None:
    fixable(pytester, {"pass@1": 0.9})
    first = pytester.runpytest(RUN)
    first.assert_outcomes(passed=2, xfailed=2, failed=1)  # t1 and t3 fail: pass@1 = 0.5
    # t1 and t3 are fixed and rerun alone: the gate judges them with t0 and t2 carried over.
    for task in ("t1", "t3"):
        (pytester.path / f"fixed-{task}").touch()
    second = pytester.runpytest(RUN, "-k", "t1 or t3 or gates")
    second.assert_outcomes(passed=3)
    assert second.ret == pytest.ExitCode.OK
    second.stdout.fnmatch_lines(["*gates: met (judged on 4 of 4 task(s); 2 from this session, 2 carried over from *"])
    gates = summary(pytester)["gates"]
    assert (gates["this_run"], gates["carried_over"], gates["metrics"]["pass@1"]) == (2, 2, 1.0)


def test_last_failed_after_a_missed_gate_judges_again(pytester: pytest.Pytester) -> None:
    fixable(pytester, {"pass@1": 0.9})
    pytester.runpytest(RUN).assert_outcomes(passed=2, xfailed=2, failed=1)
    # --lf selects the gate item alone (its tasks were xfailed): it judges the last run, not nothing.
    again = pytester.runpytest(RUN, "--lf")
    again.assert_outcomes(failed=1)
    assert again.ret == pytest.ExitCode.TESTS_FAILED
    again.stdout.fnmatch_lines(["*pass@1 = 0.5 is below the minimum 0.9*", "*0 from this session, 4 carried over*"])
    # A lower bar in the config: the same results now meet it (gates do not change the settings' fingerprint).
    fixable(pytester, {"pass@1": 0.5})
    pytester.runpytest(RUN, "--lf").assert_outcomes(passed=1)


def test_last_failed_under_xdist_judges_again(pytester: pytest.Pytester) -> None:
    fixable(pytester, {"pass@1": 0.9})
    pytester.runpytest_subprocess(RUN, "-n", "2").assert_outcomes(passed=2, xfailed=2, failed=1)
    again = pytester.runpytest_subprocess(RUN, "-n", "2", "--lf")
    assert again.ret == pytest.ExitCode.TESTS_FAILED
    # As without -n: the gate item alone, judging the last run (it reran all four tasks).
    again.assert_outcomes(failed=1)
    again.stdout.fnmatch_lines(["*pass@1 = 0.5 is below the minimum 0.9*", "*0 from this session, 4 carried over*"])


@pytest.mark.parametrize(
    ("gates", "message"),
    [
        ("{pass@1: .nan}", "Input should be a finite number"),
        ("{pass@1: .inf}", "Input should be a finite number"),
        ("{pass@1: 1.5}", "minimum 1.5 can never be met: pass@1 is at most 1"),
        ("{pass@1: -1}", "minimum -1 is always met: pass@1 is at least 0"),
        ("{tasks: -3}", "minimum -3 is always met: tasks is at least 0"),
        # Coerced in silence before: true was a minimum of 1.0, "0.9" of 0.9.
        ("{pass@1: true}", "Input should be a valid number"),
        ("{pass@1: '0.9'}", "Input should be a valid number"),
    ],
)
def test_impossible_minimums_are_config_errors_with_their_line(
    pytester: pytest.Pytester, gates: str, message: str
) -> None:
    fixable(pytester, {})
    text = (pytester.path / "agentcompass.yaml").read_text().replace("gates: {}", f"gates: {gates}")
    (pytester.path / "agentcompass.yaml").write_text(text)
    line = next(n for n, row in enumerate(text.splitlines(), 1) if "gates:" in row)
    result = pytester.runpytest(RUN)
    assert result.ret in (pytest.ExitCode.USAGE_ERROR, pytest.ExitCode.INTERRUPTED)
    out = result.stdout.str() + result.stderr.str()
    assert f"agentcompass.yaml:{line}: requests[0].gates.pass@1" in out or "requests[0].gates.tasks" in out, out
    assert message in out, out
    assert not (pytester.path / "runs").exists()


BIG = """
import dataclasses
from pytest_agentcompass import HarnessFreeBenchmark, RunResult, TaskSpec


class Big(HarnessFreeBenchmark):
    def load_tasks(self, req):
        return [TaskSpec("huge-1"), TaskSpec("huge-2"), TaskSpec("low")]

    def run_task(self, task, prepared, env, req, plan):
        return RunResult(task.task_id, output=task.task_id)

    def evaluate(self, task, prepared, result, req, plan, env=None):
        return dataclasses.replace(result, score=-1e308 if task.task_id == "low" else 1e308)
"""


def test_scores_at_the_edge_of_a_float_render_and_aggregate(pytester: pytest.Pytester) -> None:
    """Every finite float is a score: the page, the report command and the mean take it."""
    pytester.makepyfile(big=BIG)
    write_config(pytester, [{"name": "a", "benchmark": {"id": "big.py:Big"}}])
    result = pytester.runpytest_subprocess(RUN, "--agentcompass-html=page.html")
    result.assert_outcomes(passed=2, failed=1)
    assert "OverflowError" not in result.stdout.str() + result.stderr.str()
    metrics = summary(pytester)["metrics"]
    assert metrics["mean_score"] == pytest.approx(1e308 / 3) and "error" not in metrics
    page = (pytester.path / "page.html").read_text()
    assert "3 scored, 3 outside [0, 1]" in page
    run_dir = next((pytester.path / "runs" / "a").iterdir())
    report = pytester.run("python", "-m", "pytest_agentcompass", "report", str(run_dir))
    assert report.ret == 0, report.stderr.str()
    assert "3 outside [0, 1]" in (run_dir / "report.html").read_text()


SLOW = """
import asyncio, dataclasses
from pytest_agentcompass import HarnessFreeBenchmark, RunResult, TaskSpec


class Slow(HarnessFreeBenchmark):
    def load_tasks(self, req):
        return [TaskSpec(f"t{i}") for i in range(3)]

    async def run_task(self, task, prepared, env, req, plan):
        if task.task_id == "t2":
            await asyncio.sleep(600)
        return RunResult(task.task_id, output="x")

    def evaluate(self, task, prepared, result, req, plan, env=None):
        return dataclasses.replace(result, score=1.0)
"""


def test_a_gate_judged_on_an_interrupted_run_says_so(pytester: pytest.Pytester) -> None:
    # Printed "gates: MISSED (judged on 3 of 3 task(s) ...)" as if the run had finished.
    pytester.makepyfile(slow=SLOW)
    request = {"name": "a", "benchmark": {"id": "slow.py:Slow"}, "gates": {"pass@1": 0.9}}
    write_config(pytester, [request], timeout_seconds=2)
    result = pytester.runpytest_subprocess(RUN, "-p", "no:cacheprovider")
    assert result.ret != pytest.ExitCode.OK
    result.stdout.fnmatch_lines(
        ["*gates: MISSED on an interrupted run (the run was interrupted (*): 1 task(s) cancelled before they finished*"]
    )
    # The gate item's own message says it too.
    result.stdout.fnmatch_lines(["(the run was interrupted (timeout: *): 1 task(s) cancelled before they finished;*"])
