"""Runtime retries as the spec words them, rule by rule ("Runtime retry" and the scope list).

- ``max_retries`` / ``retry_pattern_list``; retries reuse the attempt's plan, a
  new semantic attempt gets a new one;
- the budget resets for each semantic attempt and is shared by its stages;
- ``retry_pattern_list: null`` retries any non-empty error, a list the errors
  matching one of its regular expressions, ``[]`` none;
- where a failure happened decides what a retry redoes (five bullets);
- failed tries go to ``retry_details/`` with their retry number, stage, scope,
  matched pattern and redacted plan; only the terminal try enters the detail;
- exhausted retries keep the exception trace or the returned error.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import SUITES, write_config
from spec_retries import read_log

SPEC = f"{SUITES / 'spec_retries.py'}:SpecBenchmark"
TRACING_ENV = f"{SUITES / 'tracing.py'}:TracingEnvironment"


def spec_run(
    pytester: pytest.Pytester,
    *,
    mode: str = "none",
    fail: dict[str, Any] | None = None,
    env_fail: dict[str, Any] | None = None,
    n: int = 1,
    **execution: Any,
) -> tuple[pytest.RunResult, list[dict[str, Any]]]:
    log = pytester.path / "calls.jsonl"
    request = {
        "name": "r",
        "benchmark": {"id": SPEC, "params": {"log": str(log), "mode": mode, "n": n, "fail": fail or {}}},
        "environment": {
            "id": TRACING_ENV,
            "params": {"trace": str(pytester.path / "env.jsonl"), "fail": env_fail or {}},
        },
        "execution": {"max_retries": 1, "retry_backoff_seconds": 0, **execution},
    }
    write_config(pytester, [request])
    result = pytester.runpytest("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider")
    return result, read_log(log)


def run_dir(pytester: pytest.Pytester) -> Path:
    (found,) = (pytester.path / "runs" / "r").iterdir()
    return found


def retry_records(pytester: pytest.Pytester) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(run_dir(pytester).glob("retry_details/*/*.json"))]


def detail(pytester: pytest.Pytester, task: str = "t0") -> dict[str, Any]:
    return json.loads((run_dir(pytester) / "details" / f"{task}.json").read_text())  # type: ignore[no-any-return]


def events(log: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in log if e["event"] == name]


# -- which errors retry ------------------------------------------------------------


@pytest.mark.parametrize(
    ("fail", "stage"),
    [
        ({"run": {"times": 1, "how": "raise"}}, "inference"),
        ({"run": {"times": 1, "how": "type_error"}}, "inference"),  # a bug: the spec retries it all the same
        ({"run": {"times": 1, "how": "result"}}, "inference_result"),
        ({"evaluate": {"times": 1, "how": "no_score"}}, "evaluation"),
        ({"evaluate": {"times": 1, "how": "result"}}, "evaluation"),
        ({"prepare": {"times": 1, "how": "raise"}}, "preparation"),
    ],
)
def test_null_retries_any_error_with_text(pytester: pytest.Pytester, fail: dict[str, Any], stage: str) -> None:
    result, _ = spec_run(pytester, fail=fail, retry_pattern_list=None)
    result.assert_outcomes(passed=1)
    (record,) = retry_records(pytester)
    assert (record["stage"], record["matched_pattern"]) == (stage, "any")


@pytest.mark.parametrize("stage", ["run", "evaluate"])
def test_null_does_not_retry_an_error_without_text(pytester: pytest.Pytester, stage: str) -> None:
    result, log = spec_run(pytester, fail={stage: {"times": 1, "how": "empty"}})
    result.assert_outcomes(errors=1)
    assert retry_records(pytester) == [] and len(events(log, "run")) == 1
    result.stdout.fnmatch_lines(["*stage returned a *_error result with no error text*"])


@pytest.mark.parametrize(
    ("patterns", "retried"),
    [
        (["agent c.ashed"], True),  # a regular expression, searched in the error text
        (["^RuntimeError"], True),  # the text of a raised error starts with its class
        (["grader", "crashed$"], True),  # any one of the list
        (["grader"], False),
        (["CRASHED"], False),  # case matters
        ([], False),  # an empty list matches nothing
    ],
)
def test_a_list_retries_only_errors_that_match(pytester: pytest.Pytester, patterns: list[str], retried: bool) -> None:
    result, log = spec_run(pytester, fail={"run": {"times": 1, "how": "raise"}}, retry_pattern_list=patterns)
    result.assert_outcomes(**({"passed": 1} if retried else {"errors": 1}))
    records = retry_records(pytester)
    assert len(events(log, "run")) == (2 if retried else 1)
    if retried:
        assert records[0]["matched_pattern"] in patterns
    else:
        assert records == []


# -- the budget ------------------------------------------------------------------


def test_the_budget_resets_for_each_semantic_attempt(pytester: pytest.Pytester) -> None:
    result, _ = spec_run(pytester, fail={"run": {"times": 1}}, attempts={"k": 3, "strategy": "avg"})
    result.assert_outcomes(passed=1)
    assert [r["attempt_index"] for r in retry_records(pytester)] == [0, 1, 2]
    assert detail(pytester)["retries"] == 3


@pytest.mark.parametrize(("budget", "passed"), [(1, False), (2, True)])
def test_the_budget_is_shared_by_the_stages_of_an_attempt(pytester: pytest.Pytester, budget: int, passed: bool) -> None:
    fail = {"prepare": {"times": 1}, "evaluate": {"times": 1}}
    result, _ = spec_run(pytester, fail=fail, max_retries=budget)
    result.assert_outcomes(**({"passed": 1} if passed else {"errors": 1}))
    assert [r["stage"] for r in retry_records(pytester)] == ["preparation", "evaluation"][:budget]


def test_retries_reuse_the_plan_and_a_new_attempt_gets_a_new_one(pytester: pytest.Pytester) -> None:
    result, log = spec_run(pytester, fail={"run": {"times": 1}}, attempts={"k": 2, "strategy": "avg"})
    result.assert_outcomes(passed=1)
    runs = events(log, "run")
    plans = list(dict.fromkeys(e["plan"] for e in runs))
    assert len(plans) == 2  # one plan per semantic attempt, none per retry
    assert [(e["attempt"], e["plan"]) for e in runs] == [(0, plans[0]), (0, plans[0]), (1, plans[1]), (1, plans[1])]
    for record in retry_records(pytester):
        assert record["plan"]["benchmark_plan"]["token"] == plans[record["attempt_index"]]


# -- what a retry redoes -------------------------------------------------------------


@pytest.mark.parametrize(
    ("fail", "env_fail", "stage"),
    [
        ({"prepare": {"times": 1}}, None, "preparation"),
        (None, {"open_task": 1}, "environment"),
        ({"run": {"times": 1}}, None, "inference"),
        ({"artifacts": {"times": 1}}, None, "artifacts"),
        (None, {"build_config": 1}, "general"),
    ],
)
def test_failures_before_evaluation_rerun_the_whole_attempt(
    pytester: pytest.Pytester, fail: dict[str, Any] | None, env_fail: dict[str, Any] | None, stage: str
) -> None:
    """Preparation, Environment, inference, artifact or general failures: a new task Environment, the same plan."""
    result, log = spec_run(pytester, fail=fail, env_fail=env_fail)
    result.assert_outcomes(passed=1)
    (record,) = retry_records(pytester)
    assert (record["stage"], record["scope"]) == (stage, "attempt")
    prepares = events(log, "prepare")
    assert len({e["plan"] for e in prepares}) == 1  # the same plan
    if len(prepares) == 2:  # a try that reached the Environment, then a new one
        assert prepares[0]["env"] != prepares[1]["env"]


def test_an_error_result_from_inference_reruns_the_whole_attempt(pytester: pytest.Pytester) -> None:
    result, log = spec_run(pytester, fail={"run": {"times": 1, "how": "result"}})
    result.assert_outcomes(passed=1)
    (record,) = retry_records(pytester)
    assert (record["stage"], record["scope"]) == ("inference_result", "attempt")
    assert record["payload"]["error"] == "the agent gave up"  # the discarded result itself
    first, second = events(log, "prepare")
    assert first["env"] != second["env"] and first["plan"] == second["plan"]


def test_a_reuse_evaluation_failure_reruns_the_whole_attempt(pytester: pytest.Pytester) -> None:
    result, log = spec_run(pytester, mode="reuse", fail={"evaluate": {"times": 1}})
    result.assert_outcomes(passed=1)
    (record,) = retry_records(pytester)
    assert (record["stage"], record["scope"]) == ("evaluation", "attempt")
    assert len(events(log, "run")) == 2
    first, second = events(log, "evaluate")
    assert first["env"] != second["env"] and first["output"] != second["output"]


def test_a_none_evaluation_failure_retries_only_evaluate(pytester: pytest.Pytester) -> None:
    result, log = spec_run(pytester, mode="none", fail={"evaluate": {"times": 1}})
    result.assert_outcomes(passed=1)
    (record,) = retry_records(pytester)
    assert (record["stage"], record["scope"]) == ("evaluation", "evaluate")
    assert len(events(log, "prepare")) == len(events(log, "run")) == 1
    first, second = events(log, "evaluate")
    # The same prepared task and run result, no Environment.
    assert (first["prepared"], first["output"], first["env"]) == (second["prepared"], second["output"], None)


def test_a_fresh_evaluation_failure_reopens_the_evaluation_environment(pytester: pytest.Pytester) -> None:
    result, log = spec_run(pytester, mode="fresh", fail={"evaluate": {"times": 1}})
    result.assert_outcomes(passed=1)
    (record,) = retry_records(pytester)
    assert (record["stage"], record["scope"]) == ("evaluation", "evaluation_environment")
    assert len(events(log, "prepare")) == len(events(log, "run")) == 1
    first, second = events(log, "evaluate")
    assert (first["prepared"], first["output"]) == (second["prepared"], second["output"])
    assert None not in (first["env"], second["env"]) and first["env"] != second["env"]


# -- what is recorded ---------------------------------------------------------------


def test_failed_tries_are_recorded_outside_the_details(pytester: pytest.Pytester) -> None:
    result, log = spec_run(pytester, n=2, fail={"artifacts": {"times": 1}})
    result.assert_outcomes(passed=2)
    folder = run_dir(pytester)
    assert sorted(p.name for p in (folder / "details").glob("*.json")) == ["t0.json", "t1.json"]
    records = retry_records(pytester)
    assert len(records) == 2  # t0 and t1 each failed once
    for record in records:
        assert {"payload", "retry_number", "stage", "scope", "matched_pattern", "plan", "error"} <= set(record)
        assert record["retry_number"] == 1 and record["stage"] == "artifacts"
    # Only the terminal try is in the detail: its output is the second run's.
    outputs = [e["output"] for e in events(log, "artifacts") if e["task"] == "t0"]
    assert detail(pytester)["output"] == outputs[-1] != outputs[0]
    assert detail(pytester)["retries"] == 1
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["counts"]["tasks"] == 2 and summary["metrics"]["tasks"] == 2


@pytest.mark.parametrize(("how", "kept"), [("raise", "the agent crashed"), ("result", "the agent gave up")])
def test_exhausted_retries_keep_the_trace_or_the_returned_error(pytester: pytest.Pytester, how: str, kept: str) -> None:
    result, _ = spec_run(pytester, fail={"run": {"times": 5, "how": how}}, max_retries=2)
    result.assert_outcomes(errors=1)
    record = detail(pytester)
    assert record["retries"] == 2 and record["status"] == "inference_error"
    assert kept in record["error"]
    if how == "raise":
        assert "RuntimeError: the agent crashed" in record["trace"]
    assert len(retry_records(pytester)) == 2
