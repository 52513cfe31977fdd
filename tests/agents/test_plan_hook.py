"""A harness's ``adjust_plan``: what it adds reaches the recorded plan and the provider; a broken one is named."""

from __future__ import annotations

import json

import pytest

from conftest import write_config

HARNESS = """\
import dataclasses
from pytest_agentcompass import BaseBenchmark, BaseHarness, RunResult, TaskSpec


class Tasks(BaseBenchmark):
    evaluation_environment_mode = "none"

    def load_tasks(self, req):
        return [TaskSpec(task_id="t0", question="q")]

    def evaluate(self, task, prepared, result, req, plan, env=None):
        return dataclasses.replace(result, score=1.0)


class Adds(BaseHarness):
    def adjust_plan(self, plan, task, req):
        return dataclasses.replace(plan, environment={**plan.environment, "from_harness": task.task_id})

    def run(self, session, task, prepared, env, req, plan):
        return RunResult(task.task_id, output=plan.environment["from_harness"])


class Broken(Adds):
    def adjust_plan(self, plan, task, req):
        raise ValueError("no recipe for this task")
"""


@pytest.mark.parametrize("harness", ["Adds", "Broken"])
def test_a_harness_adjusts_the_plan_before_the_environment_opens(pytester: pytest.Pytester, harness: str) -> None:
    (pytester.path / "parts.py").write_text(HARNESS)
    request = {
        "name": "r",
        "benchmark": {"id": "parts.py:Tasks"},
        "harness": {"id": f"parts.py:{harness}"},
        "environment": {"id": "local"},
    }
    write_config(pytester, [request])
    result = pytester.runpytest("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider")
    (run,) = (pytester.path / "runs" / "r").iterdir()
    detail = json.loads((run / "details" / "t0.json").read_text())
    if harness == "Adds":
        result.assert_outcomes(passed=1)
        assert detail["output"] == "t0"
        plans = [json.loads(line) for line in (run / "plans.jsonl").read_text().splitlines()]
        assert plans[0]["environment"] == {"from_harness": "t0"}
    else:
        result.assert_outcomes(errors=1)
        assert "the harness's adjust_plan raised ValueError: no recipe for this task" in detail["error"]
