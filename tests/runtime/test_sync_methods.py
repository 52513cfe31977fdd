"""Sync lifecycle methods run off the event loop: they overlap, and stage timeouts end them.

The planning hooks (``make_benchmark_plan``, ``adjust_plan``) included: sync
ones run in a worker thread, async ones are awaited.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import write_config

BENCH = """
import dataclasses, threading
from pytest_agentcompass import BaseAnalyzer, HarnessFreeBenchmark, PreparedTask, RunResult, TaskSpec

# Four parties: it lets them through only if all four run_task calls are in it at once.
TOGETHER = threading.Barrier(4, timeout=30)
NEVER = threading.Event()
HUNG = []  # the task ids of the hung calls running now
HUNG_LOCK = threading.Lock()


class Together(HarnessFreeBenchmark):
    def load_tasks(self, req):
        return [TaskSpec(f"t{i}") for i in range(4)]

    def prepare_task(self, task, env, req, benchmark_plan):
        assert threading.current_thread() is not threading.main_thread()
        return super().prepare_task(task, env, req, benchmark_plan)

    def run_task(self, task, prepared, env, req, plan):
        TOGETHER.wait()  # blocks the loop, and so deadlocks, if sync calls run on it
        return RunResult(task.task_id, output="ok")

    def evaluate(self, task, prepared, result, req, plan, env=None):
        return dataclasses.replace(result, score=1.0)

    def aggregate_metrics(self, results, req):
        return {"threaded": threading.current_thread() is not threading.main_thread()}


class Stuck(Together):
    def load_tasks(self, req):
        return [TaskSpec("t0")]

    def run_task(self, task, prepared, env, req, plan):
        NEVER.wait(20)  # a blocking SDK call that hangs
        return RunResult(task.task_id, output="late")


def off_loop():
    return threading.current_thread() is not threading.main_thread()


class SyncPlan(Together):
    def make_benchmark_plan(self, task, req):
        return {"threaded": off_loop()}

    async def adjust_plan(self, plan, task, req):
        return dataclasses.replace(plan, benchmark_plan={**plan.benchmark_plan, "adjusted": True})

    def run_task(self, task, prepared, env, req, plan):
        assert plan.benchmark_plan == {"threaded": True, "adjusted": True}, plan.benchmark_plan
        return RunResult(task.task_id, output="ok")


class AsyncPlan(SyncPlan):
    async def make_benchmark_plan(self, task, req):
        return {"threaded": True}

    def adjust_plan(self, plan, task, req):
        return dataclasses.replace(plan, benchmark_plan={**plan.benchmark_plan, "adjusted": off_loop()})


class StuckPlan(Together):
    def make_benchmark_plan(self, task, req):
        if task.task_id == "t1":  # not t0, which preflight plans before the deadline starts
            NEVER.wait(20)
        return None

    def run_task(self, task, prepared, env, req, plan):
        return RunResult(task.task_id, output="ok")


class Exhausted(Together):
    def load_tasks(self, req):
        return [TaskSpec("t0")]

    def run_task(self, task, prepared, env, req, plan):
        return RunResult(task.task_id, output="ok")

    def evaluate(self, task, prepared, result, req, plan, env=None):
        return next(iter(()))  # an exhausted iterator: StopIteration, which no future takes


class Starved(Together):
    # More hung sync calls than the pool has threads (16 at task_concurrency 4), then quick tasks.

    def load_tasks(self, req):
        return [TaskSpec(f"hang{i:02d}") for i in range(20)] + [TaskSpec(f"ok{i}") for i in range(4)]

    async def prepare_task(self, task, env, req, benchmark_plan):
        # On the loop: a quick task's first call for a thread is its run_task, under the timeout.
        return PreparedTask(task_id=task.task_id)

    def run_task(self, task, prepared, env, req, plan):
        if task.task_id.startswith("hang"):
            with HUNG_LOCK:
                HUNG.append(task.task_id)
            NEVER.wait(60)
            HUNG.remove(task.task_id)
        return RunResult(task.task_id, output=f"{len(HUNG)} hung calls running")


class Where(BaseAnalyzer):
    name = "where"

    def analyze(self, task, result, req):
        return {"threaded": threading.current_thread() is not threading.main_thread()}
"""


def run(
    pytester: pytest.Pytester, bench: str, timeout_seconds: float | None = None, grace: float = 1, **execution: object
) -> tuple[pytest.RunResult, Path]:
    pytester.makepyfile(bench=BENCH)
    request = {
        "name": "r",
        "benchmark": {"id": f"bench.py:{bench}"},
        "environment": {"id": "local", "params": {"base_dir": str(pytester.path)}},
        "analyzers": [{"id": "bench.py:Where"}],
        "execution": {"retry_backoff_seconds": 0, "max_retries": 0, **execution},
    }
    top = {"timeout_seconds": timeout_seconds} if timeout_seconds else {}
    write_config(pytester, [request], task_concurrency=4, cleanup_grace_seconds=grace, **top)
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider")
    (run_dir,) = (pytester.path / "runs" / "r").iterdir()
    return result, run_dir


def test_four_sync_run_tasks_run_at_once(pytester: pytest.Pytester) -> None:
    result, run_dir = run(pytester, "Together")
    result.assert_outcomes(passed=4)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["metrics"]["threaded"] is True
    detail = json.loads(next((run_dir / "details").iterdir()).read_text())
    assert detail["analysis"]["where"] == {"threaded": True}


def test_a_stage_timeout_ends_a_blocked_sync_run_task(pytester: pytest.Pytester) -> None:
    result, _ = run(pytester, "Stuck", timeouts={"run": 0.5})
    result.assert_outcomes(errors=1)
    output = result.stdout.str()
    assert "inference stage timed out after 0.5s (execution.timeouts.run)" in output
    assert "Stuck.run_task is still running in a worker thread" in output


def test_the_wait_for_a_blocked_call_at_the_end_is_said(pytester: pytest.Pytester) -> None:
    # The session sat silent for the whole cleanup grace (30 s by default) after the last task.
    result, _ = run(pytester, "Stuck", grace=4, timeouts={"run": 0.5})
    result.assert_outcomes(errors=1)
    result.stderr.fnmatch_lines(
        [
            "agentcompass: waiting up to 3 s more (cleanup_grace_seconds) for blocking calls that ignore cancellation: "
            "*Stuck.run_task*"
        ]
    )


@pytest.mark.parametrize("bench", ["SyncPlan", "AsyncPlan"])
def test_planning_hooks_may_be_sync_or_async(pytester: pytest.Pytester, bench: str) -> None:
    # Sync planning hooks ran on the loop; an async one's coroutine was recorded as the plan.
    result, run_dir = run(pytester, bench)
    result.assert_outcomes(passed=4)
    plans = json.loads((run_dir / "run_info.json").read_text())["resolved_execution_plans"]
    recorded = [attempt["benchmark_plan"] for task in plans.values() for attempt in task.values()]
    assert recorded == [{"threaded": True, "adjusted": True}] * 4


def test_the_deadline_ends_a_blocked_sync_make_benchmark_plan(pytester: pytest.Pytester) -> None:
    result, _ = run(pytester, "StuckPlan", timeout_seconds=1)
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*orchestration timeout of 1*s reached*",
            "*blocking call(s) still running*abandoned*StuckPlan.make_benchmark_plan",
        ]
    )


def test_a_sync_method_raising_stop_iteration_fails_its_task_naming_the_method(pytester: pytest.Pytester) -> None:
    # It hung the task for good: the future of a thread's call refuses a StopIteration.
    result, run_dir = run(pytester, "Exhausted")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*Exhausted.evaluate raised StopIteration*"])
    detail = json.loads((run_dir / "details" / "t0.json").read_text())
    assert "Exhausted.evaluate raised StopIteration" in str(detail["error"]), detail["error"]


def test_hung_sync_calls_past_their_timeout_leave_threads_for_the_other_tasks(pytester: pytest.Pytester) -> None:
    # Each abandoned call kept its thread, and the pool's size counted it: once 16 hung, the quick
    # tasks queued for a thread until their own stage timed out ("inference stage timed out").
    result, run_dir = run(pytester, "Starved", timeouts={"run": 0.5})
    result.assert_outcomes(passed=4, errors=20)
    for i in range(4):  # served while the hung calls still ran (not queued behind them until they ended)
        detail = json.loads((run_dir / "details" / f"ok{i}.json").read_text())
        assert detail["passed"] and detail["output"] == "20 hung calls running", (detail["output"], detail["error"])
    # The calls still running at the end are named once each, with how many.
    assert "Starved.run_task (20 calls)" in result.stdout.str() + result.stderr.str()
