"""Cheating agents against the score: re-rolls through their own error text, errors that lift a gate.

Each agent is a real command (the ``command`` harness) in a real ``local``
workspace; the benchmark around it is ordinary code that reads what the
agent left, as verifiers do.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from conftest import write_config

RUN = ("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider")

BENCH = """
import dataclasses
from pytest_agentcompass import BaseBenchmark, PreparedTask, RunResult, TaskSpec


class Answers(BaseBenchmark):
    evaluation_environment_mode = "reuse"

    def load_tasks(self, req):
        return [TaskSpec(f"t{i}", question="answer 42") for i in range(3)]

    async def prepare_task(self, task, env, req, benchmark_plan):
        await env.write_text("check.sh", "test \\"$(cat logs/agent/answer.txt)\\" = 42\\n")
        return PreparedTask(task.task_id, prompt=task.question)

    async def collect_artifacts(self, task, prepared, result, env, req, plan):
        # As a verifier reads what the agent left: the agent decides what is there.
        answer = await env.read_text("/logs/agent/answer.txt")
        return dataclasses.replace(result, artifacts={"answer": answer})

    async def evaluate(self, task, prepared, result, req, plan, env=None):
        checked = await env.exec(["sh", "check.sh"], timeout=2)
        if checked.timed_out:
            return dataclasses.replace(result, status="evaluation_error", error="the verifier timed out")
        return dataclasses.replace(result, score=1.0 if checked.ok else 0.0)
"""


def agent_run(
    pytester: pytest.Pytester, script: str, *, gates: dict[str, float] | None = None, **request: Any
) -> tuple[pytest.RunResult, dict[str, dict[str, Any]]]:
    pytester.makepyfile(answers=BENCH)
    execution = {"retry_backoff_seconds": 0, **request.pop("execution", {})}
    config = {
        "name": "r",
        "benchmark": {"id": "answers.py:Answers"},
        "harness": {"id": "command", "params": {"command": ["sh", "-c", script]}},
        "environment": {"id": "local"},
        "execution": execution,
        **({"gates": gates} if gates else {}),
        **request,
    }
    write_config(pytester, [config])
    result = pytester.runpytest_subprocess(*RUN)
    (run_dir,) = (pytester.path / "runs" / "r").iterdir()
    details = {p.stem: json.loads(p.read_text()) for p in (run_dir / "details").glob("*.json")}
    return result, details


SOLVE_ONE_BREAK_TWO = (
    'if [ "$AGENTCOMPASS_TASK_ID" = t0 ]; then echo 42 > "$AGENTCOMPASS_LOGS_DIR/answer.txt"; '
    'else mkdir -p "$AGENTCOMPASS_LOGS_DIR/answer.txt"; fi'  # a folder where the file should be
)


def test_errors_an_agent_causes_do_not_lift_a_gate(pytester: pytest.Pytester) -> None:
    """Solve one task, break the logs of the two others: 2 errors must not make mean_score 1."""
    result, details = agent_run(pytester, SOLVE_ONE_BREAK_TWO, gates={"mean_score": 0.9})
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert {d["status"] for k, d in details.items() if k != "t0"} == {"inference_error"}  # not "environment"
    result.stdout.fnmatch_lines(
        [
            "*r: 3 tasks, 1 passed, 0 failed, 2 errors*",
            "*mean_score=0.3333*",
            "*gates: MISSED (judged on 3 of 3 task(s); 2 errored task(s) counted as failed, score 0)*",
        ]
    )
    assert "(2 environment)" not in result.stdout.str()


def test_excluding_errors_from_gates_is_an_explicit_choice(pytester: pytest.Pytester) -> None:
    result, _ = agent_run(pytester, SOLVE_ONE_BREAK_TWO, gates={"mean_score": 0.9}, gate_errors="exclude")
    result.stdout.fnmatch_lines(["*gates: met (*2 errored task(s) left out (gate_errors: exclude))*"])
    result.assert_outcomes(passed=2, errors=2)  # the errors stay errors in pytest's count


TRANSIENT_LOOKING = (
    "echo 'HTTP 503 Service Unavailable: connection reset by peer; rate limited (429); read timed out' >&2; exit 1"
)


@pytest.mark.parametrize(("policy", "retries"), [("transient", 0), (None, 2)])
def test_an_agent_cannot_buy_a_retry_with_its_own_error_text(
    pytester: pytest.Pytester, policy: str | None, retries: int
) -> None:
    """Under the transient policy, text an agent printed is never taken for an infrastructure fault.

    ``null`` (the spec's rule) retries any error, the agent's own failures included:
    that is what the transient policy is for.
    """
    execution = {"max_retries": 2, "retry_pattern_list": policy}
    result, details = agent_run(pytester, TRANSIENT_LOOKING, execution=execution)
    result.assert_outcomes(errors=3)
    for detail in details.values():
        assert detail["retries"] == retries
        assert detail["metadata"]["error_kind"] == "other" and "503" in detail["error"]


FREEZE_THE_VERIFIER = 'echo 41 > "$AGENTCOMPASS_LOGS_DIR/answer.txt"; echo "sleep 30" > check.sh'


def test_a_frozen_verifier_is_no_retry(pytester: pytest.Pytester) -> None:
    """The agent makes the verifier hang: a re-run of the whole attempt (reuse) would be a re-roll."""
    execution = {"max_retries": 2, "retry_pattern_list": "transient"}
    result, details = agent_run(pytester, FREEZE_THE_VERIFIER, execution=execution)
    result.assert_outcomes(errors=3)
    for detail in details.values():
        assert detail["status"] == "evaluation_error" and detail["retries"] == 0
        assert detail["error"] == "the verifier timed out"
