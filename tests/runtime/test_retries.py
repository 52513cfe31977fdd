"""Runtime retries: the scope table row by row, patterns, budgets, retry records."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pytest_agentcompass.runtime.retry import (
    RETRY_SCOPE,
    RetryBudget,
    RetryPolicy,
    RetryScope,
    Stage,
    StageFailure,
    retry_scope,
)

from conftest import tracing_request, write_config
from tracing import read_trace


def run(pytester: pytest.Pytester, trace: Path, **request: Any) -> tuple[pytest.RunResult, Counter[str]]:
    execution = {"max_retries": 1, **request.pop("execution", {})}
    write_config(pytester, [tracing_request("r", trace, n=1, execution=execution, **request)])
    result = pytester.runpytest("--agentcompass=agentcompass.yaml")
    return result, Counter(
        e["event"] + (f":{e['purpose']}" if e["event"] == "env_open" else "") for e in read_trace(trace)
    )


def retry_records(pytester: pytest.Pytester) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(pytester.path.glob("runs/r/*/retry_details/t0/*.json"))]


# (injection, mode, expected stage, expected scope, calls expected after one retry)
ROWS = [
    ({"env_params": {"fail": {"build_config": 1}}}, "none", "general", "attempt", {"env_open:task": 1, "evaluate": 1}),
    (
        {"env_params": {"fail": {"open_task": 1}}},
        "none",
        "environment",
        "attempt",
        {"env_open:task": 1, "prepare_task": 1, "evaluate": 1},
    ),
    (
        {"fail": {"prepare": 1}},
        "none",
        "preparation",
        "attempt",
        {"env_open:task": 2, "prepare_task": 2, "run_task": 1},
    ),
    ({"fail": {"run": 1}}, "none", "inference", "attempt", {"env_open:task": 2, "run_task": 2}),
    ({"error_result": {"run": 1}}, "none", "inference_result", "attempt", {"env_open:task": 2, "run_task": 2}),
    ({"fail": {"artifacts": 1}}, "none", "artifacts", "attempt", {"env_open:task": 2, "collect_artifacts": 2}),
    (
        {"fail": {"evaluate": 1}},
        "none",
        "evaluation",
        "evaluate",
        {"env_open:task": 1, "run_task": 1, "collect_artifacts": 1, "evaluate": 2},
    ),
    ({"fail": {"evaluate": 1}}, "reuse", "evaluation", "attempt", {"env_open:task": 2, "run_task": 2, "evaluate": 2}),
    (
        {"fail": {"evaluate": 1}},
        "fresh",
        "evaluation",
        "evaluation_environment",
        {"env_open:task": 1, "run_task": 1, "env_open:evaluation": 2, "evaluate": 2},
    ),
    (
        {"env_params": {"fail": {"open_evaluation": 1}}},
        "fresh",
        "evaluation",
        "evaluation_environment",
        {"env_open:task": 1, "run_task": 1, "env_open:evaluation": 1, "evaluate": 1},
    ),
]


@pytest.mark.parametrize(("injection", "mode", "stage", "scope", "calls"), ROWS)
def test_retry_scope_rows(
    pytester: pytest.Pytester,
    trace: Path,
    injection: dict[str, Any],
    mode: str,
    stage: str,
    scope: str,
    calls: dict[str, int],
) -> None:
    result, counts = run(pytester, trace, mode=mode, **injection)
    result.assert_outcomes(passed=1)
    for event, count in calls.items():
        assert counts[event] == count, (event, counts)
    (record,) = retry_records(pytester)
    assert (record["stage"], record["scope"], record["retry_number"]) == (stage, scope, 1)
    assert record["matched_pattern"] == "any"  # retry_pattern_list: null, the spec's rule
    assert record["plan"]["evaluation_environment_mode"] == mode
    assert counts["env_open:task"] + counts["env_open:evaluation"] == counts["env_close"]


def test_every_table_row_is_tested() -> None:
    # The scopes written by hand in ROWS (each checked against real calls above)
    # must be what the table says, and every table row must have a test row.
    expected = {(Stage(row[2]), row[1]): RetryScope(row[3]) for row in ROWS}
    for (stage, mode), scope in RETRY_SCOPE.items():
        rows = {m: s for (st, m), s in expected.items() if st is stage and (mode is None or m == mode)}
        if mode is None:  # rows of modes the table names on their own belong to those entries
            rows = {m: s for m, s in rows.items() if (stage, m) not in RETRY_SCOPE}
        assert rows, f"no test row for {stage} in mode {mode or 'any'}"
        for row_mode, row_scope in rows.items():
            assert row_scope is scope, (stage, row_mode, row_scope, scope)
    for (stage, mode), row_scope in expected.items():
        assert retry_scope(stage, mode) is row_scope  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("patterns", "retried", "matched"),
    [
        (None, True, "any"),
        ("transient", True, "kind:transport"),
        (["injected \\w+ failure"], True, "injected \\w+ failure"),
        (["timeout"], False, None),
        ([], False, None),
    ],
)
def test_retry_pattern_list(
    pytester: pytest.Pytester, trace: Path, patterns: list[str] | str | None, retried: bool, matched: str | None
) -> None:
    result, counts = run(pytester, trace, fail={"run": 1}, execution={"retry_pattern_list": patterns})
    if retried:
        result.assert_outcomes(passed=1)
        assert retry_records(pytester)[0]["matched_pattern"] == matched
    else:
        result.assert_outcomes(errors=1)
        assert counts["run_task"] == 1 and retry_records(pytester) == []


def failure(error: str, cause: BaseException | None = None) -> StageFailure:
    return StageFailure(Stage.INFERENCE, error, cause=cause)


def test_budget_matching_unit() -> None:
    budget = RetryBudget(RetryPolicy.of(2, ["429", "overloaded"]))
    assert budget.take(failure("")) is None
    assert budget.take(failure("HTTP 429 Too Many Requests")) == "429"
    assert budget.take(failure("bad request")) is None
    assert budget.take(failure("server overloaded")) == "overloaded"
    assert budget.take(failure("429 again")) is None  # exhausted
    assert RetryBudget(RetryPolicy.of(1, [])).take(failure("rate limited (429)")) is None
    # Explicit patterns ignore the kind: a TypeError retries when a pattern says so.
    assert RetryBudget(RetryPolicy.of(1, ["TypeError"])).take(failure("TypeError: x", TypeError("x"))) == "TypeError"


def test_scope_table_drives_behaviour(pytester: pytest.Pytester, trace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Change one row: the runner must follow the table, not a scope of its own.
    monkeypatch.setitem(RETRY_SCOPE, (Stage.EVALUATION, "reuse"), RetryScope.EVALUATE)
    result, counts = run(pytester, trace, mode="reuse", fail={"evaluate": 1})
    result.assert_outcomes(passed=1)
    assert (counts["env_open:task"], counts["run_task"], counts["evaluate"]) == (1, 1, 2)
    assert retry_records(pytester)[0]["scope"] == "evaluate"
    monkeypatch.setitem(RETRY_SCOPE, (Stage.INFERENCE, None), RetryScope.EVALUATE)
    trace.unlink()
    result, counts = run(pytester, trace, fail={"run": 1})
    # No level of the runner retries "evaluate" for an inference failure but the attempt itself.
    result.assert_outcomes(passed=1)
    assert counts["run_task"] == 2


def test_budget_resets_for_each_semantic_attempt(pytester: pytest.Pytester, trace: Path) -> None:
    result, counts = run(
        pytester, trace, fail_each_attempt={"run": 1}, execution={"attempts": {"k": 3, "strategy": "avg"}}
    )
    result.assert_outcomes(passed=1)
    assert counts["run_task"] == 6
    assert len(retry_records(pytester)) == 3
    (detail,) = pytester.path.glob("runs/r/*/details/t0.json")
    assert json.loads(detail.read_text())["retries"] == 3


def test_budget_is_shared_by_the_stages_of_an_attempt(pytester: pytest.Pytester, trace: Path) -> None:
    result, _ = run(pytester, trace, fail={"prepare": 1, "evaluate": 1})
    result.assert_outcomes(errors=1)
    (detail,) = pytester.path.glob("runs/r/*/details/t0.json")
    data = json.loads(detail.read_text())
    assert data["status"] == "evaluation_error"
    assert data["error"] == "ConnectionError: injected evaluate failure"
    assert "injected evaluate failure" in data["trace"]


def test_retries_stay_out_of_details(pytester: pytest.Pytester, trace: Path) -> None:
    write_config(
        pytester,
        [tracing_request("r", trace, n=4, fail={"run": {"t1": 2, "t3": 1}}, execution={"max_retries": 3})],
    )
    result = pytester.runpytest("--agentcompass=agentcompass.yaml", "--junitxml=j.xml")
    result.assert_outcomes(passed=4)
    (run_dir,) = (pytester.path / "runs/r").iterdir()
    assert sorted(p.name for p in (run_dir / "details").iterdir()) == [f"t{i}.json" for i in range(4)]
    assert sorted(str(p.relative_to(run_dir)) for p in (run_dir / "retry_details").rglob("*.json")) == [
        "retry_details/t1/attempt-0-retry-1.json",
        "retry_details/t1/attempt-0-retry-2.json",
        "retry_details/t3/attempt-0-retry-1.json",
    ]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["counts"] == {
        "tasks": 4,
        "passed": 4,
        "failed": 0,
        "errors": 0,
        "environment_errors": 0,
        "task_errors": 0,
        "integrity_flagged": 0,
        "carried_over": 0,
        "resumed": 0,
        "retries": 3,
    }
    assert 'name="agentcompass.retries" value="2"' in (pytester.path / "j.xml").read_text()


def test_exhausted_retries_keep_the_returned_error(pytester: pytest.Pytester, trace: Path) -> None:
    result, counts = run(pytester, trace, error_result={"run": -1}, execution={"max_retries": 2})
    result.assert_outcomes(errors=1)
    assert counts["run_task"] == 3
    result.stdout.fnmatch_lines(
        ["*inference_error in the inference_result stage: rate limited (429)*", "after 2 retries"]
    )


def test_retry_detail_plan_is_redacted(pytester: pytest.Pytester, trace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKEN", "tok-123456")
    request = tracing_request("r", trace, n=1, fail={"run": 1}, execution={"max_retries": 1})
    request["model"] = {"id": "model-${TOKEN}"}
    write_config(pytester, [request])
    pytester.runpytest("--agentcompass=agentcompass.yaml").assert_outcomes(passed=1)
    (record,) = retry_records(pytester)
    assert record["plan"]["components"]["model"] == "model-***"


def test_scope_enum_values() -> None:
    assert {s.value for s in RetryScope} == {"attempt", "evaluate", "evaluation_environment"}


def test_environment_faults_have_their_own_status(pytester: pytest.Pytester, trace: Path) -> None:
    result, _ = run(pytester, trace, env_params={"fail": {"open_task": -1}}, execution={"max_retries": 1})
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*environment_error in the environment stage: RuntimeError: injected open failure*"])
    result.stdout.fnmatch_lines(["r: 1 task, 0 passed, 0 failed, 1 error (1 environment), 1 retry"])
    (run_dir,) = (pytester.path / "runs/r").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["tasks"][0]["status"] == "environment_error"
    assert summary["metrics"]["environment_errors"] == 1 and summary["counts"]["environment_errors"] == 1
