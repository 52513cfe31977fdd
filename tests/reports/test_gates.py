"""Gates on aggregate metrics: the gate item, xfailed tasks, config errors, xdist."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from conftest import TRACING, tracing_request, write_config

RUN = "--agentcompass=agentcompass.yaml"


def gated(pytester: pytest.Pytester, trace: Path, gates: dict[str, Any], wrong: list[str], **bench: Any) -> Path:
    request = tracing_request("a", trace, n=4, wrong=wrong, **bench)
    request["gates"] = gates
    return write_config(pytester, [request])


def test_missed_gate_fails_its_item_and_names_value_and_minimum(pytester: pytest.Pytester, trace: Path) -> None:
    gated(pytester, trace, {"pass@1": 0.7, "mean_score": 0.5}, wrong=["t1", "t2"])
    result = pytester.runpytest(RUN, "-rA", "--junitxml=junit.xml")
    # Below-threshold tasks are expected: the request is judged by its gates.
    result.assert_outcomes(passed=2, xfailed=2, failed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "*_ a::gates _*",
            "request 'a': 1 of 2 gate(s) missed",
            "  pass@1 = 0.5 is below the minimum 0.7",
            "  ok: mean_score = 0.5 >= 0.5",
        ],
        consecutive=False,
    )
    result.stdout.fnmatch_lines(["*XFAIL*a::t1 - below the pass threshold; the request is judged by its gates*"])
    result.stdout.fnmatch_lines(["*gates: MISSED*", "*missed: pass@1 = 0.5 is below the minimum 0.7*"])
    # The short summary gives the reason, as for a task; junit's message is that line.
    result.stdout.fnmatch_lines(["FAILED agentcompass.yaml::a::gates - request 'a': 1 of 2 gate(s) missed"])
    cases = {c.get("name"): c for c in ET.parse(pytester.path / "junit.xml").getroot().iter("testcase")}
    failure = cases["gates"].find("failure")
    assert failure is not None
    assert failure.get("message") == "request 'a': 1 of 2 gate(s) missed"
    assert "pass@1 = 0.5 is below the minimum 0.7" in (failure.text or "")


def test_met_gates_pass_and_the_run_exits_zero(pytester: pytest.Pytester, trace: Path) -> None:
    gated(pytester, trace, {"pass@1": 0.7}, wrong=["t1"])
    result = pytester.runpytest(RUN, "-v")
    result.assert_outcomes(passed=4, xfailed=1)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*agentcompass.yaml::a::gates PASSED*"])
    lines = result.stdout.lines
    gate_line = next(i for i, line in enumerate(lines) if "::a::gates " in line)
    assert all("::a::t" not in line for line in lines[gate_line:]), "the gate is judged after every task"


def test_errors_stay_errors_with_gates(pytester: pytest.Pytester, trace: Path) -> None:
    gated(pytester, trace, {"pass@1": 0.1}, wrong=[], fail={"run": {"t0": -1}})
    result = pytester.runpytest(RUN)
    result.assert_outcomes(passed=4, errors=1)


def test_gates_select_with_k_and_skip_without_tasks(pytester: pytest.Pytester, trace: Path) -> None:
    gated(pytester, trace, {"pass@1": 0.7}, wrong=[])
    result = pytester.runpytest(RUN, "-k", "gates", "-rs")
    result.assert_outcomes(skipped=1, deselected=4)
    result.stdout.fnmatch_lines(["*request 'a': nothing to judge: no task of it ran in this session*"])


def test_unknown_metric_is_a_config_error_with_file_and_line(pytester: pytest.Pytester, trace: Path) -> None:
    gated(pytester, trace, {"pass@3": 0.5}, wrong=[])
    result = pytester.runpytest(RUN)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(
        ["*agentcompass.yaml:*: requests[[]0[]].gates.pass@3: unknown metric 'pass@3'; TracingBenchmark returns: *"]
    )


def test_non_numeric_minimum_is_a_config_error(pytester: pytest.Pytester, trace: Path) -> None:
    gated(pytester, trace, {"pass@1": "high"}, wrong=[])
    result = pytester.runpytest(RUN)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*agentcompass.yaml:*: requests[[]0[]].gates.pass@1: *number*"])


CUSTOM = f"""
import sys
sys.path.insert(0, {str(Path(TRACING).parent)!r})
from tracing import TracingBenchmark


class Custom(TracingBenchmark):
    def aggregate_metrics(self, results, req):
        return {{"accuracy": sum(r.score or 0 for r in results) / len(results)}}


class Declared(Custom):
    metric_names = ("accuracy",)
"""


def custom_config(pytester: pytest.Pytester, trace: Path, cls: str, gates: dict[str, float]) -> None:
    pytester.makepyfile(custom=CUSTOM)
    request = tracing_request("a", trace, n=4, wrong=["t0"])
    request["benchmark"]["id"] = f"custom.py:{cls}"
    request["gates"] = gates
    write_config(pytester, [request])


def test_custom_metric_gate(pytester: pytest.Pytester, trace: Path) -> None:
    custom_config(pytester, trace, "Custom", {"accuracy": 0.9})
    result = pytester.runpytest(RUN)
    result.assert_outcomes(passed=3, xfailed=1, failed=1)
    result.stdout.fnmatch_lines(["*accuracy = 0.75 is below the minimum 0.9*"])


def test_undeclared_custom_metrics_are_checked_after_aggregation(pytester: pytest.Pytester, trace: Path) -> None:
    custom_config(pytester, trace, "Custom", {"acuracy": 0.5})
    result = pytester.runpytest(RUN)
    result.assert_outcomes(passed=3, xfailed=1, failed=1)
    result.stdout.fnmatch_lines(["*acuracy: not among the metrics aggregate_metrics returned (accuracy)*"])


def test_declared_custom_metrics_are_checked_in_the_config(pytester: pytest.Pytester, trace: Path) -> None:
    custom_config(pytester, trace, "Declared", {"acuracy": 0.5})
    result = pytester.runpytest(RUN)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*[[]0[]].gates.acuracy: unknown metric 'acuracy'; Declared returns: accuracy"])


@pytest.mark.parametrize(("wrong", "code", "outcomes"), [(["t1", "t2"], 1, {"failed": 1}), (["t1"], 0, {"passed": 1})])
def test_gate_item_under_xdist(
    pytester: pytest.Pytester, trace: Path, wrong: list[str], code: int, outcomes: dict[str, int]
) -> None:
    gated(pytester, trace, {"pass@1": 0.7}, wrong=wrong)
    result = pytester.runpytest_subprocess(RUN, "-n", "2", "--junitxml=junit.xml", "-rA")
    expected = {"passed": 4 - len(wrong), "xfailed": len(wrong)}
    for key, value in outcomes.items():
        expected[key] = expected.get(key, 0) + value
    result.assert_outcomes(**expected)
    assert result.ret == code
    cases = {c.get("name"): c for c in ET.parse(pytester.path / "junit.xml").getroot().iter("testcase")}
    assert "gates" in cases
    assert (cases["gates"].find("failure") is not None) == bool(code)
    if code:
        result.stdout.fnmatch_lines(["*pass@1 = 0.5 is below the minimum 0.7*"])
        # Judged on the controller: the same one-line reason as in process.
        result.stdout.fnmatch_lines(["FAILED agentcompass.yaml::a::gates - request 'a': 1 of 1 gate(s) missed"])
        assert cases["gates"].find("failure").get("message") == "request 'a': 1 of 1 gate(s) missed"  # type: ignore[union-attr]


def test_gate_names_are_checked_where_the_runtime_builds_the_request(tmp_path: Path) -> None:
    """Not in the pytest face: any caller of ``build_request`` gets the config error."""
    from pytest_agentcompass import ComponentRef, ConfigError, HarnessFreeBenchmark, RunRequest, TaskSpec
    from pytest_agentcompass.runtime.assembly import build_request
    from pytest_agentcompass.runtime.registry import Registry

    class TwoTasks(HarnessFreeBenchmark):
        def load_tasks(self, req: RunRequest) -> list[TaskSpec]:
            return [TaskSpec("a"), TaskSpec("b")]

    registry = Registry(tmp_path)
    registry.register("benchmark", "two", TwoTasks)
    req = RunRequest(name="r", benchmark=ComponentRef(id="two"), gates={"accuracy": 0.5, "pass@1": 1.5})
    with pytest.raises(ConfigError) as caught:
        build_request(0, req, registry)
    assert str(caught.value).splitlines() == [
        "r: gates.accuracy: unknown metric 'accuracy'; TwoTasks returns: errors, k, mean_score, pass@1, passed,"
        " scored, tasks",
        "r: gates.pass@1: minimum 1.5 can never be met: pass@1 is at most 1",
    ]
