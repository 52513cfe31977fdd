"""Error kinds and the transient policy (``retry_pattern_list: transient``).

A kind comes from what was raised and where, never from text: an error
message, a verifier's output or a file name can be written by the agent.
"""

from __future__ import annotations

import json
import shutil
from typing import Any

import pytest

from pytest_agentcompass.runtime.retry import (
    TRANSIENT_KINDS,
    ErrorKind,
    RetryPolicy,
    Stage,
    StageFailure,
    classify,
    declared_kind,
    should_retry,
)
from pytest_agentcompass.vocabulary.errors import EnvironmentLost, SessionError, UserExit, WorkspacePathError

from conftest import SUITES, tracing_request, write_config

HEAD = """
import dataclasses
from pytest_agentcompass import HarnessFreeBenchmark, RunResult, TaskSpec
from pytest_agentcompass.vocabulary.errors import EnvironmentLost, SessionError
"""


class RateLimitError(Exception):
    """Named like the openai SDK's, which is matched by class name (the SDK is never imported here)."""


def _foreign(name: str, module: str) -> Exception:
    """An exception of a class defined in another package (``docker.errors.APIError``, ``requests...``)."""
    cls = type(name, (Exception,), {"__module__": module})
    return cls("boom")  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("exc", "stage", "kind"),
    [
        (ConnectionResetError("reset"), Stage.INFERENCE, ErrorKind.TRANSPORT),
        (_foreign("ConnectionError", "requests.exceptions"), Stage.EVALUATION, ErrorKind.TRANSPORT),
        (RateLimitError("slow down"), Stage.INFERENCE, ErrorKind.RATE_LIMIT),
        (_foreign("APITimeoutError", "openai"), Stage.INFERENCE, ErrorKind.TIMEOUT),
        # A wait inside a stage the agent takes part in: it can make that wait run out.
        (TimeoutError(), Stage.INFERENCE, ErrorKind.STAGE_TIMEOUT),
        (TimeoutError(), Stage.EVALUATION, ErrorKind.STAGE_TIMEOUT),
        (TimeoutError(), Stage.PREPARATION, ErrorKind.TIMEOUT),
        # Raised inside a benchmark's or harness's code: a file the agent broke raises these too.
        (SessionError("cannot read '/logs/agent/x'"), Stage.ARTIFACTS, ErrorKind.OTHER),
        (_foreign("APIError", "docker.errors"), Stage.ARTIFACTS, ErrorKind.OTHER),
        (EnvironmentLost("the Docker engine stopped answering"), Stage.INFERENCE, ErrorKind.ENVIRONMENT),
        (TypeError("unsupported operand"), Stage.INFERENCE, ErrorKind.PROGRAMMING),
        (KeyError("answer"), Stage.EVALUATION, ErrorKind.PROGRAMMING),
        (WorkspacePathError("../etc"), Stage.INFERENCE, ErrorKind.PROGRAMMING),
        (UserExit("sys.exit(1)"), Stage.INFERENCE, ErrorKind.EXIT),
        (RuntimeError("HTTP 503: connection reset, timed out, rate limited (429)"), Stage.INFERENCE, ErrorKind.OTHER),
        (None, Stage.INFERENCE, ErrorKind.OTHER),
    ],
)
def test_kinds_come_from_the_exception_and_the_stage(exc: BaseException | None, stage: Stage, kind: ErrorKind) -> None:
    assert classify(exc, stage) is kind
    failure = StageFailure(stage, f"{type(exc).__name__}: {exc}", cause=exc)
    decision = should_retry(RetryPolicy.of(1, "transient"), failure, 0)
    assert (decision is not None) is (kind in TRANSIENT_KINDS)


@pytest.mark.parametrize(
    ("metadata", "kind"),
    [
        ({"error_kind": "rate_limit"}, ErrorKind.RATE_LIMIT),
        ({"error_kind": "transport"}, ErrorKind.TRANSPORT),
        ({"error_kind": "timeout"}, ErrorKind.TIMEOUT),
        ({"retryable": False}, ErrorKind.PERMANENT),
        ({"error_kind": "environment"}, ErrorKind.OTHER),  # only the runtime's own calls are infrastructure
        ({"error_kind": "nonsense"}, ErrorKind.OTHER),
        ({"error_kind": ["rate_limit"]}, ErrorKind.OTHER),
        ({}, ErrorKind.OTHER),
    ],
)
def test_a_returned_result_has_the_kind_its_component_declared(metadata: dict[str, Any], kind: ErrorKind) -> None:
    assert declared_kind(metadata) is kind


def test_exit_and_permanent_failures() -> None:
    exit_failure = StageFailure(Stage.INFERENCE, "UserExit: sys.exit(1)", cause=UserExit("sys.exit(1)"))
    for patterns in (None, ".", "transient"):
        policy = RetryPolicy.of(1, [patterns] if patterns == "." else patterns)
        assert should_retry(policy, exit_failure, 0) is None  # sys.exit() is a decision, not an error
    permanent = StageFailure(Stage.INFERENCE_RESULT, "AuthenticationError (HTTP 401)", kind=ErrorKind.PERMANENT)
    assert should_retry(RetryPolicy.of(1, None), permanent, 0) is None
    assert should_retry(RetryPolicy.of(1, "transient"), permanent, 0) is None
    assert should_retry(RetryPolicy.of(1, ["HTTP 401"]), permanent, 0) == "HTTP 401"


def test_transient_is_the_only_named_policy() -> None:
    with pytest.raises(ValueError, match="'transiet' is not a policy"):
        RetryPolicy.of(1, "transiet")


def test_an_unknown_policy_is_a_config_error_with_its_line(pytester: pytest.Pytester) -> None:
    request = tracing_request("r", pytester.path / "t.jsonl", n=1, execution={"retry_pattern_list": "transiet"})
    write_config(pytester, [request])
    result = pytester.runpytest("--agentcompass=agentcompass.yaml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*agentcompass.yaml:*: requests[[]0].execution.retry_pattern_list: *'transiet' is not a retry policy*"]
    )


# -- in a run, with the transient policy -------------------------------------------------


def run_bench(pytester: pytest.Pytester, body: str, **execution: Any) -> tuple[pytest.RunResult, dict[str, Any]]:
    pytester.makepyfile(bench=HEAD + body)
    request = {
        "name": "r",
        "benchmark": {"id": "bench.py:B"},
        "execution": {"max_retries": 1, "retry_backoff_seconds": 0, "retry_pattern_list": "transient", **execution},
    }
    write_config(pytester, [request])
    result = pytester.runpytest("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider")
    (detail,) = pytester.path.glob("runs/r/*/details/t0.json")
    return result, json.loads(detail.read_text())


BENCH = """
class B(HarnessFreeBenchmark):
    def load_tasks(self, req):
        return [TaskSpec("t0")]
    def run_task(self, task, prepared, env, req, plan):
        open("tries", "a").write("x")
{run}
        return RunResult(task.task_id, output="x")
    def evaluate(self, task, prepared, result, req, plan, env=None):
        return dataclasses.replace(result, score=1.0)
"""


@pytest.mark.parametrize(
    ("run", "status", "kind", "retried"),
    [
        # The agent broke its logs: the provider raises, inside the benchmark's code.
        ('        raise SessionError("cannot read /logs/agent in container abc")', "inference_error", "other", False),
        # A component says "environment_error": not believed, that is the runtime's word.
        (
            '        return RunResult(task.task_id, status="environment_error", error="container gone")',
            "inference_error",
            "other",
            False,
        ),
        (
            '        return RunResult(task.task_id, status="inference_error", error="x", '
            'metadata={"error_kind": "rate_limit"})',
            "inference_error",
            "rate_limit",
            True,
        ),
        ('        raise EnvironmentLost("the engine stopped answering")', "environment_error", "environment", True),
    ],
    ids=["session-error-in-component", "returned-environment-error", "declared-rate-limit", "environment-lost"],
)
def test_who_can_cause_it_decides_the_kind(
    pytester: pytest.Pytester, run: str, status: str, kind: str, retried: bool
) -> None:
    result, detail = run_bench(pytester, BENCH.format(run=run), max_retries=0)
    result.assert_outcomes(errors=1)
    assert (detail["status"], detail["metadata"]["error_kind"]) == (status, kind)
    if "environment_error" in run:
        assert detail["metadata"]["returned_status"] == "environment_error"
    # With a retry in the budget, only the transient kinds take it.
    (pytester.path / "tries").unlink()
    shutil.rmtree(pytester.path / "runs")
    run_bench(pytester, BENCH.format(run=run))
    assert len((pytester.path / "tries").read_text()) == (2 if retried else 1)


@pytest.mark.parametrize(("stage", "retried"), [("prepare", True), ("run", False), ("evaluate", False)])
def test_a_stage_timeout_is_transient_only_before_the_agent(
    pytester: pytest.Pytester, stage: str, retried: bool
) -> None:
    """Hanging (or freezing its verifier) must not buy an agent another try."""
    trace = pytester.path / "trace.jsonl"
    execution = {"max_retries": 1, "retry_pattern_list": "transient", "timeouts": {stage: 0.2}}
    write_config(pytester, [tracing_request("r", trace, n=1, sleep={stage: 30}, execution=execution)])
    result = pytester.runpytest("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    calls = [json.loads(line)["event"] for line in trace.read_text().splitlines()]
    event = {"prepare": "prepare_task", "run": "run_task", "evaluate": "evaluate"}[stage]
    assert calls.count(event) == (2 if retried else 1)
    (detail,) = pytester.path.glob("runs/r/*/details/t0.json")
    assert json.loads(detail.read_text())["metadata"]["error_kind"] == ("timeout" if retried else "stage_timeout")


@pytest.mark.parametrize(
    ("status", "kind", "retried"),
    [(429, "rate_limit", True), (503, "transport", True), (400, "other", False)],
)
def test_a_model_endpoint_fault_keeps_its_kind_through_the_harness(
    pytester: pytest.Pytester, status: int, kind: str, retried: bool
) -> None:
    """The openai client's exception class (not the message) names the kind of the harness's error result."""
    from openai_server import answer, error, scripted_server

    with scripted_server() as server:
        server.push(error(status, "scripted failure"), answer("done"))
        request = {
            "name": "r",
            "benchmark": {"id": f"{SUITES / 'file_tasks.py'}:FileTasks", "params": {"n": 1}},
            "harness": {"id": "openai"},
            "model": {"id": "m", "params": {"base_url": server.base_url, "api_key": "sk-test-kinds", "max_retries": 0}},
            "execution": {"max_retries": 1, "retry_backoff_seconds": 0, "retry_pattern_list": "transient"},
        }
        write_config(pytester, [request])
        pytester.runpytest("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider")
        assert len(server.requests) == (2 if retried else 1)
    records = list(pytester.path.glob("runs/r/*/retry_details/*/*.json"))
    if retried:
        (record,) = records
        assert json.loads(record.read_text())["error_kind"] == kind
    else:
        (detail,) = pytester.path.glob("runs/r/*/details/*.json")
        assert json.loads(detail.read_text())["metadata"]["error_kind"] == kind
