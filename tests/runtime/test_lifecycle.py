"""One attempt follows the spec's sequence exactly, in every evaluation mode."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from conftest import tracing_request, write_config
from tracing import read_trace

ROOT = Path(__file__).parents[2]


def steps(trace: Path, task: str = "t0") -> list[str]:
    """The trace of one task as compact ``event[:detail]`` strings."""
    out = []
    envs: dict[str, str] = {}
    for e in read_trace(trace):
        if e.get("task") not in (None, task) or e["event"] in ("load_tasks", "select_tasks"):
            continue
        if e["event"] == "env_open":
            if e["task"] != task:
                continue
            envs[e["env"]] = e["purpose"]
            out.append(f"env_open:{e['purpose']}:{e['policy']}")
        elif e["event"] == "env_close":
            if e["env"] in envs:
                out.append(f"env_close:{envs[e['env']]}")
        elif e["event"] == "set_network_policy":
            if e["env"] in envs:
                out.append(f"policy:{envs[e['env']]}:{e['policy']}")
        elif e["event"] == "evaluate":
            where = envs.get(e["env"], "none") if e["env"] else "none"
            out.append(f"evaluate:{where}:{e['policy']}")
        else:
            out.append(e["event"])
    return out


NETWORK = {"network": {"baseline": "full", "run": "disabled", "evaluation": "disabled"}}


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        (
            "none",
            [
                "env_open:task:full",
                "prepare_task",
                "policy:task:disabled",
                "run_task",
                "collect_artifacts",
                "env_close:task",
                "evaluate:none:None",
            ],
        ),
        (
            "reuse",
            [
                "env_open:task:full",
                "prepare_task",
                "policy:task:disabled",
                "run_task",
                "collect_artifacts",
                "evaluate:task:disabled",
                "policy:task:full",
                "env_close:task",
            ],
        ),
        (
            "fresh",
            [
                "env_open:task:full",
                "prepare_task",
                "policy:task:disabled",
                "run_task",
                "collect_artifacts",
                "env_close:task",
                "env_open:evaluation:full",
                "policy:evaluation:disabled",
                "evaluate:evaluation:disabled",
                "policy:evaluation:full",
                "env_close:evaluation",
            ],
        ),
    ],
)
def test_harness_free_order(pytester: pytest.Pytester, trace: Path, mode: str, expected: list[str]) -> None:
    write_config(pytester, [tracing_request("r", trace, n=1, mode=mode, environment=NETWORK)])
    pytester.runpytest("--agentcompass=agentcompass.yaml").assert_outcomes(passed=1)
    assert steps(trace) == expected


@pytest.mark.parametrize("mode", ["none", "reuse", "fresh"])
def test_harness_order(pytester: pytest.Pytester, trace: Path, mode: str) -> None:
    write_config(pytester, [tracing_request("r", trace, n=1, mode=mode, harness=True, environment=NETWORK)])
    pytester.runpytest("--agentcompass=agentcompass.yaml").assert_outcomes(passed=1)
    assert steps(trace)[:8] == [
        "env_open:task:full",
        "prepare_task",
        "adjust_input",
        "start_session",
        "policy:task:disabled",
        "harness_run",
        "close_session",
        "collect_artifacts",
    ]
    run = next(e for e in read_trace(trace) if e["event"] == "harness_run")
    assert run["prompt"] == "q0!" and run["policy"] == "disabled"  # adjusted input, run policy


def test_fresh_session_does_not_see_the_task_workspace(pytester: pytest.Pytester, trace: Path) -> None:
    write_config(pytester, [tracing_request("r", trace, n=1, mode="fresh")])
    pytester.runpytest("--agentcompass=agentcompass.yaml").assert_outcomes(passed=1)
    events = read_trace(trace)
    evaluate = next(e for e in events if e["event"] == "evaluate")
    task_env = next(e["env"] for e in events if e["event"] == "env_open" and e["purpose"] == "task")
    assert evaluate["env"] != task_env
    assert evaluate["sees_workspace"] is False  # answer.txt reached the evaluator only as an artifact


def test_reuse_session_is_the_task_session(pytester: pytest.Pytester, trace: Path) -> None:
    write_config(pytester, [tracing_request("r", trace, n=1, mode="reuse")])
    pytester.runpytest("--agentcompass=agentcompass.yaml").assert_outcomes(passed=1)
    events = read_trace(trace)
    evaluate = next(e for e in events if e["event"] == "evaluate")
    task_env = next(e["env"] for e in events if e["event"] == "env_open")
    assert evaluate["env"] == task_env and evaluate["sees_workspace"] is True


@pytest.mark.parametrize(
    ("request_mode", "task_mode", "bench_mode", "resolved"),
    [
        ("fresh", "reuse", "none", "fresh"),
        (None, "reuse", "none", "reuse"),
        (None, None, "fresh", "fresh"),
        (None, None, None, "none"),
    ],
)
def test_mode_resolution_order(
    pytester: pytest.Pytester, request_mode: Any, task_mode: Any, bench_mode: Any, resolved: str
) -> None:
    bench_attr = f"evaluation_environment_mode = {bench_mode!r}" if bench_mode else ""
    pytester.makepyfile(
        bench=f"""
        import dataclasses
        from pytest_agentcompass import HarnessFreeBenchmark, RunResult, TaskSpec
        class B(HarnessFreeBenchmark):
            {bench_attr}
            def load_tasks(self, req):
                return [TaskSpec("t", evaluation_environment_mode={task_mode!r})]
            def run_task(self, task, prepared, env, req, plan):
                return RunResult(task.task_id, output=plan.evaluation_environment_mode)
            def evaluate(self, task, prepared, result, req, plan, env=None):
                assert (env is None) == (plan.evaluation_environment_mode == "none")
                return dataclasses.replace(result, score=1.0)
        """
    )
    write_config(
        pytester,
        [
            {
                "name": "r",
                "benchmark": {"id": "bench.py:B"},
                "environment": {"evaluation_environment_mode": request_mode},
            }
        ],
    )
    pytester.runpytest("--agentcompass=agentcompass.yaml").assert_outcomes(passed=1)
    (detail,) = pytester.path.glob("runs/r/*/details/t.json")
    assert json.loads(detail.read_text())["output"] == resolved


def test_plans_are_recorded_before_environments_open(pytester: pytest.Pytester, trace: Path) -> None:
    write_config(pytester, [tracing_request("r", trace, n=2, mode="fresh", environment=NETWORK)])
    pytester.runpytest("--agentcompass=agentcompass.yaml").assert_outcomes(passed=2)
    (run_dir,) = (pytester.path / "runs/r").iterdir()
    plans = json.loads((run_dir / "run_info.json").read_text())["resolved_execution_plans"]
    assert set(plans) == {"t0", "t1"}
    plan = plans["t0"]["0"]
    assert plan["evaluation_environment_mode"] == "fresh"
    assert (plan["baseline_network_policy"], plan["run_network_policy"], plan["evaluation_network_policy"]) == (
        "full",
        "disabled",
        "disabled",
    )
    assert plan["components"]["environment"].endswith("TracingEnvironment")


def test_recorded_before_open_even_when_open_hangs(pytester: pytest.Pytester, trace: Path) -> None:
    # The plan line exists while the Environment is still opening.
    write_config(
        pytester,
        [tracing_request("r", trace, n=1, env_params={"sleep": {"open": 30}})],
        timeout_seconds=1,
        cleanup_grace_seconds=5,
    )
    pytester.runpytest("--agentcompass=agentcompass.yaml").assert_outcomes(errors=1)
    (run_dir,) = (pytester.path / "runs/r").iterdir()
    assert json.loads((run_dir / "plans.jsonl").read_text().splitlines()[0])["task_id"] == "t0"
    assert not [e for e in read_trace(trace) if e["event"] == "env_open"]


def test_policy_the_provider_cannot_honour_fails_before_anything_opens(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        bench="""
        from pytest_agentcompass import HarnessFreeBenchmark, TaskSpec
        OPENED = []
        class B(HarnessFreeBenchmark):
            def load_tasks(self, req):
                return [TaskSpec("a"), TaskSpec("b")]
            def prepare_task(self, *args):
                raise AssertionError("nothing may run")
        """
    )
    write_config(
        pytester, [{"name": "r", "benchmark": {"id": "bench.py:B"}, "environment": {"network": {"run": "disabled"}}}]
    )
    result = pytester.runpytest("--agentcompass=agentcompass.yaml")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(["*request 'r': environment 'local' does not support network policy 'disabled'*"])
    assert "nothing may run" not in result.stdout.str()


def test_keep_environment_keeps_and_lists(pytester: pytest.Pytester, trace: Path) -> None:
    write_config(
        pytester,
        [tracing_request("r", trace, n=1, mode="fresh", execution={"keep_environment": True})],
    )
    result = pytester.runpytest("--agentcompass=agentcompass.yaml")
    result.assert_outcomes(passed=1)
    assert not [e for e in read_trace(trace) if e["event"] == "env_close"]
    result.stdout.fnmatch_lines(["kept environments*", "  r::t0: task: *", "  r::t0: evaluation: *"])
    kept = [line.split(": ", 2)[-1] for line in result.outlines if line.startswith("  r::t0:")]
    assert len(kept) == 2 and all(Path(p).is_dir() for p in kept)
    evaluate = next(e for e in read_trace(trace) if e["event"] == "evaluate")
    assert evaluate["sees_workspace"] is False  # keeping changes nothing about which session evaluates
    (run_dir,) = (pytester.path / "runs/r").iterdir()
    assert len(json.loads((run_dir / "run_info.json").read_text())["kept_environments"]) == 2
    for path in kept:
        shutil.rmtree(path)


def test_failing_close_does_not_mask_a_failing_run(pytester: pytest.Pytester, trace: Path) -> None:
    write_config(
        pytester,
        [tracing_request("r", trace, n=1, fail={"run": 1}, env_params={"fail": {"close": True}})],
    )
    result = pytester.runpytest("--agentcompass=agentcompass.yaml")
    result.assert_outcomes(errors=2)  # setup (the run) and teardown (the close)
    result.stdout.fnmatch_lines(["*ERROR at setup of r::t0*", "*injected run failure*"], consecutive=False)
    (detail,) = pytester.path.glob("runs/r/*/details/t0.json")
    data = json.loads(detail.read_text())
    assert data["error"] == "ConnectionError: injected run failure"
    assert "injected close failure" in data["cleanup_errors"][0]


def test_failing_harness_close_is_recorded_not_fatal(pytester: pytest.Pytester, trace: Path) -> None:
    write_config(pytester, [tracing_request("r", trace, n=1, harness=True, fail={"close_session": True})])
    result = pytester.runpytest("--agentcompass=agentcompass.yaml")
    result.assert_outcomes(passed=1, errors=1)
    assert "close_session" in steps(trace)


@pytest.mark.parametrize(
    "where",
    [
        {"env_params": {"sleep": {"open": 30}}},
        {"sleep": {"prepare": 30}},
        {"sleep": {"run": 30}},
        {"sleep": {"artifacts": 30}},
        {"sleep": {"evaluate": 30}},
        {"sleep": {"run": 30}, "harness": True},
    ],
    ids=["open", "prepare", "run", "artifacts", "evaluate", "harness-run"],
)
@pytest.mark.parametrize("mode", ["reuse", "fresh"])
def test_cancel_in_any_stage_cleans_up(
    pytester: pytest.Pytester, trace: Path, where: dict[str, Any], mode: str
) -> None:
    ws = pytester.path / "ws"
    ws.mkdir()
    where = dict(where)
    env_params = {"base_dir": str(ws), **where.pop("env_params", {})}
    write_config(
        pytester,
        [tracing_request("r", trace, n=2, mode=mode, env_params=env_params, **where)],
        timeout_seconds=1.5,
        cleanup_grace_seconds=10,
    )
    result = pytester.runpytest("--agentcompass=agentcompass.yaml")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(["*cancelled*timeout: orchestration timeout of 1.5s reached*"])
    events = read_trace(trace)
    opened = {e["env"] for e in events if e["event"] == "env_open"}
    closed = {e["env"] for e in events if e["event"] == "env_close"}
    assert opened == closed
    assert [e for e in events if e["event"] == "start_session"] == [] or len(
        [e for e in events if e["event"] == "close_session"]
    ) == len([e for e in events if e["event"] == "start_session"])
    assert list(ws.iterdir()) == []
    (run_dir,) = (pytester.path / "runs/r").iterdir()
    info = json.loads((run_dir / "run_info.json").read_text())
    assert info["status"] == "timeout" and sorted(info["unfinished_tasks"]) == ["t0", "t1"]
    assert not list((run_dir / "details").glob("*.json")) if (run_dir / "details").exists() else True


def test_analyzers_never_touch_the_score(pytester: pytest.Pytester, trace: Path) -> None:
    pytester.makepyfile(
        analyzers="""
        from pytest_agentcompass import BaseAnalyzer
        class Length(BaseAnalyzer):
            name = "length"
            family = "size"
            requires = frozenset({"file"})
            def analyze(self, task, result, req):
                return {"chars": len(result.artifacts["file"]["answer.txt"])}
        class Shadowed(Length):
            name = "shadowed"   # same family, configured later: not selected
        class Broken(BaseAnalyzer):
            name = "broken"
            def analyze(self, task, result, req):
                raise ValueError("analyzer bug")
        class Elsewhere(BaseAnalyzer):
            name = "elsewhere"
            datasets = frozenset({"some-other-benchmark"})
            def analyze(self, task, result, req):
                return {}
        """
    )
    request = tracing_request("r", trace, n=1)
    request["analyzers"] = [{"id": f"analyzers.py:{n}"} for n in ("Length", "Shadowed", "Broken", "Elsewhere")]
    request["judge"] = {"id": "judge-model", "version": "2026-06", "params": {"temperature": 0}}
    write_config(pytester, [request])
    pytester.runpytest("--agentcompass=agentcompass.yaml").assert_outcomes(passed=1)
    (detail,) = pytester.path.glob("runs/r/*/details/t0.json")
    data = json.loads(detail.read_text())
    assert data["score"] == 1.0 and data["status"] == "scored"
    assert data["analysis"] == {"length": {"chars": 2}}
    assert data["analysis_errors"] == {"broken": "ValueError: analyzer bug"}
    assert data["judge"] == {"id": "judge-model", "version": "2026-06", "params": {"temperature": 0}}


def test_recipes_adjust_declared_fields_only(pytester: pytest.Pytester, trace: Path) -> None:
    pytester.makeconftest(
        """
        import dataclasses
        class ForceFresh:
            name = "force-fresh"
            overrides = frozenset({"evaluation_environment_mode"})
            def matches(self, req, task):
                return task.task_id == "t1"
            def adjust(self, plan, req, task):
                return dataclasses.replace(plan, evaluation_environment_mode="fresh")
        class Sneaky:
            name = "sneaky"
            overrides = frozenset()
            def matches(self, req, task):
                return task.task_id == "t2"
            def adjust(self, plan, req, task):
                return dataclasses.replace(plan, run_network_policy="disabled")
        def pytest_agentcompass_recipes(req):
            return [ForceFresh(), Sneaky()]
        """
    )
    write_config(pytester, [tracing_request("r", trace, n=3, mode="none")])
    result = pytester.runpytest("--agentcompass=agentcompass.yaml")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*recipe 'sneaky' changed plan fields it does not declare: run_network_policy*"])
    (run_dir,) = (pytester.path / "runs/r").iterdir()
    plans = json.loads((run_dir / "run_info.json").read_text())["resolved_execution_plans"]
    assert plans["t1"]["0"]["evaluation_environment_mode"] == "fresh"
    assert plans["t1"]["0"]["recipes"] == ["force-fresh"]
    assert plans["t0"]["0"]["evaluation_environment_mode"] == "none"


def test_the_specification_samples_run_as_written(pytester: pytest.Pytester) -> None:
    shutil.copytree(ROOT / "example_suites", pytester.path / "example_suites")
    result = pytester.runpytest_subprocess("--agentcompass=example_suites/evaluation_modes/agentcompass.yaml", "-v")
    result.assert_outcomes(passed=4, failed=1)
    for line in ["*exact-match::sum-wrong FAILED*", "*workspace::greet PASSED*", "*patch::fix-status PASSED*"]:
        result.stdout.fnmatch_lines([line])  # tasks finish in any order
    (detail,) = pytester.path.glob("example_suites/evaluation_modes/.agentcompass/runs/patch/*/details/fix-status.json")
    data = json.loads(detail.read_text())
    assert '+status = "fixed"' in data["artifacts"]["file"]["submission.patch"]
    assert data["metadata"]["verifier"]["exit_code"] == 0
    assert data["evaluation_environment_mode"] == "fresh"
