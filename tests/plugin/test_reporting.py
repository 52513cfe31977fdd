"""Outcomes reach pytest the standard way: terminal, junit, exit codes, --lf, -x, --durations."""

from __future__ import annotations

import json
import os
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import tracing_request, write_config
from tracing import read_trace


def mixed_config(pytester: pytest.Pytester, trace: Path, **execution: object) -> Path:
    # t0 passes, t1 answers wrong, t2 errors in run_task (always).
    return write_config(
        pytester,
        [tracing_request("mix", trace, n=3, wrong=["t1"], fail={"run": {"t2": -1}}, execution=execution)],
    )


def test_pass_fail_error_outcomes_and_exit_code(pytester: pytest.Pytester, trace: Path) -> None:
    mixed_config(pytester, trace)
    result = pytester.runpytest("--agentcompass=agentcompass.yaml", "-rA")
    result.assert_outcomes(passed=1, failed=1, errors=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "*ERROR at setup of mix::t2*",
            "inference_error in the inference stage: ConnectionError: injected run failure",
            "*tracing.py*in run_task*",
        ],
        consecutive=False,
    )
    result.stdout.fnmatch_lines(["*score 0.0 is below the pass threshold 1.0*", "*expected: 'Q1'*"], consecutive=False)


def test_all_passing_exits_zero(pytester: pytest.Pytester, trace: Path) -> None:
    write_config(pytester, [tracing_request("ok", trace, n=3)])
    result = pytester.runpytest("--agentcompass=agentcompass.yaml")
    result.assert_outcomes(passed=3)
    assert result.ret == pytest.ExitCode.OK


@pytest.mark.parametrize("properties", ["brief", "all"])
def test_junit_has_failure_error_and_properties(pytester: pytest.Pytester, trace: Path, properties: str) -> None:
    mixed_config(pytester, trace)
    option = f"--agentcompass-properties={properties}"
    pytester.runpytest("--agentcompass=agentcompass.yaml", "--junitxml=junit.xml", option)
    root = ET.parse(pytester.path / "junit.xml").getroot()
    cases = {f"{case.get('classname')}::{case.get('name')}": case for case in root.iter("testcase")}
    assert set(cases) == {"agentcompass.yaml.mix::t0", "agentcompass.yaml.mix::t1", "agentcompass.yaml.mix::t2"}
    cases = {name.split(".")[-1]: case for name, case in cases.items()}
    assert cases["mix::t0"].find("failure") is None and cases["mix::t0"].find("error") is None
    assert cases["mix::t1"].find("failure") is not None
    assert cases["mix::t2"].find("error") is not None
    for name, case in cases.items():
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        assert props["agentcompass.status"] in {"scored", "inference_error"}, name
        assert Path(props["agentcompass.detail"]).is_file()
        if properties == "all":
            assert props["agentcompass.evaluation_environment_mode"] == "none"
            assert props["agentcompass.attempts"] == "1"
            assert (props["agentcompass.retries"], props["agentcompass.carried_over"]) == ("0", "False")
            assert props["agentcompass.integrity"] == ""
        else:  # a first attempt's plain run: what the brief set leaves out says nothing
            assert set(props) == {"agentcompass.status", "agentcompass.score", "agentcompass.detail"}, name
    assert {p.get("name"): p.get("value") for p in cases["mix::t0"].iter("property")}["agentcompass.score"] == "1.0"


BROKEN = """
from pytest_agentcompass import HarnessFreeBenchmark


class B(HarnessFreeBenchmark):
    def load_tasks(self, req):
        raise RuntimeError("the dataset is gone\\nhint: check the mirror")
"""


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["in-process", "xdist"])
def test_the_short_summary_and_junit_say_each_problem_in_a_line(
    pytester: pytest.Pytester, trace: Path, workers: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As for a plain test (``FAILED test_x.py::test_y - AssertionError: ...``): the node id, then
    the problem's first line; junit's ``message`` is that line, its text the whole report."""
    pytester.makepyfile(broken=BROKEN)
    monkeypatch.setenv("COLUMNS", "200")  # the short summary cuts a reason at the terminal's width
    mix = tracing_request("mix", trace, n=3, wrong=["t1"], fail={"run": {"t2": -1}})
    write_config(pytester, [mix])
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "--junitxml=junit.xml", *workers)
    result.stdout.fnmatch_lines(
        [
            "FAILED agentcompass.yaml::mix::t1 - score 0.0 is below the pass threshold 1.0*",
            "ERROR agentcompass.yaml::mix::t2 - inference_error in the inference stage: ConnectionError: injected*",
        ],
        consecutive=False,
    )
    root = ET.parse(pytester.path / "junit.xml").getroot()
    error = next(case for case in root.iter("testcase") if case.get("name") == "t2").find("error")
    assert error is not None
    assert error.get("message") == (
        'failed on setup with "inference_error in the inference stage: ConnectionError: injected run failure"'
    )
    assert "tracing.py" in (error.text or "")
    # A request whose tasks cannot be loaded: the exception it raised.
    write_config(pytester, [{"name": "broken", "benchmark": {"id": "broken.py:B"}}], name="broken.yaml")
    result = pytester.runpytest_subprocess("--agentcompass=broken.yaml", *workers)
    result.assert_outcomes(errors=1)  # once, not once per xdist worker
    result.stdout.fnmatch_lines(
        ["ERROR broken.yaml::broken - request 'broken': loading tasks failed: RuntimeError: the dataset is gone"]
    )
    # --tb=line: the problem's line, as for a plain test.
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "--tb=line", *workers)
    result.stdout.fnmatch_lines(["score 0.0 is below the pass threshold 1.0"], consecutive=False)
    assert "_Crash" not in result.stdout.str()


def test_tasks_with_equal_outcomes_share_their_property_pairs(pytester: pytest.Pytester, trace: Path) -> None:
    """Every item keeps its ``user_properties`` to the end of the session: a pair that many tasks
    carry alike (``agentcompass.status: scored``) is one tuple, not one per task (issue 27)."""
    write_config(pytester, [tracing_request("ok", trace, n=3)])
    pytester.makeconftest(
        """
        PAIRS = []
        def pytest_runtest_logreport(report):
            if report.when == "teardown":
                PAIRS.append({pair[0]: pair for pair in report.user_properties})
        def pytest_sessionfinish(session):
            first, *others = PAIRS
            shared = sorted(k for k in first if all(o[k] is first[k] for o in others))
            print("SHARED:", ",".join(shared))
        """
    )
    result = pytester.runpytest_subprocess(
        "--agentcompass=agentcompass.yaml", "-s", "--junitxml=junit.xml", "--agentcompass-properties=all"
    )
    result.assert_outcomes(passed=3)
    line = next(x for x in result.stdout.lines if "SHARED:" in x)
    shared = set(line.split("SHARED: ")[1].split(","))
    assert "agentcompass.detail" not in shared  # each task's own file
    assert {"agentcompass.status", "agentcompass.attempts", "agentcompass.score", "agentcompass.carried_over"} <= shared


def test_outcomes_are_released_before_junit_writes_its_file(pytester: pytest.Pytester, trace: Path) -> None:
    """At session finish junit builds its whole file in memory: the outcomes are gone by then
    (issue 27: peak memory), and the terminal summary still says what they were."""
    mixed_config(pytester, trace)
    pytester.makeconftest(
        """
        import pytest
        from pytest_agentcompass.plugin.keys import run_key
        @pytest.hookimpl(tryfirst=True)
        def pytest_sessionfinish(session):
            run = session.config.stash[run_key]
            held = sum(len(state.outcomes) for state in run.runtimes)
            print("OUTCOMES HELD AT SESSION FINISH:", held, [i.outcome for i in run.items].count(None))
        """
    )
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-s", "--junitxml=junit.xml")
    result.assert_outcomes(passed=1, failed=1, errors=1)
    result.stdout.fnmatch_lines(
        ["*OUTCOMES HELD AT SESSION FINISH: 0 3*", "*mix: 3 tasks, 1 passed, 1 failed, 1 error*"]
    )


def test_last_failed_reruns_only_failed_tasks(pytester: pytest.Pytester, trace: Path) -> None:
    mixed_config(pytester, trace)
    pytester.runpytest("--agentcompass=agentcompass.yaml").assert_outcomes(passed=1, failed=1, errors=1)
    trace.unlink()
    result = pytester.runpytest("--agentcompass=agentcompass.yaml", "--lf", "--agentcompass-new-run")
    result.assert_outcomes(failed=1, errors=1, deselected=1)
    ran = {e["task"] for e in read_trace(trace) if e["event"] == "prepare_task"}
    assert ran == {"t1", "t2"}


def test_exitfirst_stops_dispatching(pytester: pytest.Pytester, trace: Path) -> None:
    write_config(
        pytester,
        [tracing_request("x", trace, n=6, wrong=["t0"], execution={})],
        task_concurrency=1,
    )
    result = pytester.runpytest("--agentcompass=agentcompass.yaml", "-x")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*stopping after 1 failures*"])
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    ran = [e["task"] for e in read_trace(trace) if e["event"] == "prepare_task"]
    assert ran == ["t0"]
    (run_dir,) = (pytester.path / "runs/x").iterdir()
    assert json.loads((run_dir / "run_info.json").read_text())["status"] == "stopped"


def test_maxfail(pytester: pytest.Pytester, trace: Path) -> None:
    write_config(pytester, [tracing_request("x", trace, n=6, wrong=["t0", "t1", "t2"])], task_concurrency=1)
    result = pytester.runpytest("--agentcompass=agentcompass.yaml", "--maxfail=2")
    result.assert_outcomes(failed=2)


def test_durations_show_task_time(pytester: pytest.Pytester, trace: Path) -> None:
    write_config(pytester, [tracing_request("slow", trace, n=1, sleep={"run": 0.3})])
    result = pytester.runpytest("--agentcompass=agentcompass.yaml", "--durations=1", "-vv")
    result.stdout.re_match_lines([r"0\.[3-9]\d+s call +agentcompass.yaml::slow::t0"])


def test_cleanup_failure_is_a_teardown_error_that_keeps_the_result(pytester: pytest.Pytester, trace: Path) -> None:
    write_config(pytester, [tracing_request("c", trace, n=1, env_params={"fail": {"close": True}})])
    result = pytester.runpytest("--agentcompass=agentcompass.yaml", "--junitxml=junit.xml")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*ERROR at teardown of c::t0*", "*cleanup failed (the task's own result is kept)*"])
    (detail,) = (pytester.path / "runs/c").glob("*/details/t0.json")
    data = json.loads(detail.read_text())
    assert data["score"] == 1.0 and data["status"] == "scored"
    assert "injected close failure" in data["cleanup_errors"][0]


def test_tasks_run_concurrently(pytester: pytest.Pytester, trace: Path) -> None:
    write_config(pytester, [tracing_request("c", trace, n=8, sleep={"run": 0.4})], task_concurrency=8)
    pytester.runpytest("--agentcompass=agentcompass.yaml").assert_outcomes(passed=8)
    events = read_trace(trace)
    depth = peak = 0
    for event in events:
        if event["event"] == "run_task":
            depth += 1
            peak = max(peak, depth)
        elif event["event"] == "collect_artifacts":
            depth -= 1
    assert peak == 8


def test_terminal_summary_per_request(pytester: pytest.Pytester, trace: Path) -> None:
    mixed_config(pytester, trace)
    result = pytester.runpytest("--agentcompass=agentcompass.yaml")
    result.stdout.fnmatch_lines(
        [
            "*= agentcompass =*",
            "mix: 3 tasks, 1 passed, 1 failed, 1 error",
            "  metrics: tasks=3, scored=2, errors=1, passed=1, k=1, mean_score=0.3333, pass@1=0.3333",
            "  run directory: *runs/mix/*",
        ]
    )


def test_task_logs_are_attached_to_their_own_report(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        bench="""
        import asyncio, dataclasses, logging
        from pytest_agentcompass import HarnessFreeBenchmark, RunResult, TaskSpec
        log = logging.getLogger("my.bench")
        class B(HarnessFreeBenchmark):
            def load_tasks(self, req):
                return [TaskSpec(f"t{i}") for i in range(4)]
            async def run_task(self, task, prepared, env, req, plan):
                for step in range(3):
                    log.warning("task %s step %d", task.task_id, step)
                    await asyncio.sleep(0.01)  # interleave with the other tasks
                return RunResult(task.task_id, output=task.task_id)
            def evaluate(self, task, prepared, result, req, plan, env=None):
                return dataclasses.replace(result, score=0.0 if task.task_id == "t2" else 1.0)
        """
    )
    write_config(pytester, [{"name": "r", "benchmark": {"id": "bench.py:B"}}], task_concurrency=4)
    result = pytester.runpytest("--agentcompass=agentcompass.yaml")
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*Captured log call*",
            "WARNING  my.bench: task t2 step 0",
            "WARNING  my.bench: task t2 step 1",
            "WARNING  my.bench: task t2 step 2",
        ]
    )
    assert "task t1 step" not in result.stdout.str()


def test_failed_first_dispatches_failures_first(pytester: pytest.Pytester, trace: Path) -> None:
    write_config(pytester, [tracing_request("x", trace, n=5, wrong=["t3"])], task_concurrency=1)
    pytester.runpytest("--agentcompass=agentcompass.yaml").assert_outcomes(passed=4, failed=1)
    trace.unlink()
    pytester.runpytest("--agentcompass=agentcompass.yaml", "--ff").assert_outcomes(passed=4, failed=1)
    ran = [e["task"] for e in read_trace(trace) if e["event"] == "prepare_task"]
    assert ran[0] == "t3"


def test_a_broken_reporting_hook_stops_cleanly_and_loses_nothing(pytester: pytest.Pytester, trace: Path) -> None:
    pytester.makeconftest(
        """
        def pytest_agentcompass_task_finished(item, outcome):
            raise RuntimeError("hook bug")
        """
    )
    write_config(pytester, [tracing_request("r", trace, n=30, sleep={"run": 0.05})], task_concurrency=4)
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", timeout=60)
    assert result.ret == pytest.ExitCode.INTERNAL_ERROR
    result.stdout.fnmatch_lines(["INTERNALERROR*RuntimeError: hook bug"])
    (run_dir,) = (pytester.path / "runs/r").iterdir()
    info = json.loads((run_dir / "run_info.json").read_text())
    assert info["status"] == "stopped"
    # Tasks already running when reporting broke finished and were recorded; none was half-written.
    assert len(list((run_dir / "details").glob("*.json"))) == info["counts"]["tasks"] >= 1


LEAKY = """
import dataclasses, logging
from pytest_agentcompass import HarnessFreeBenchmark, RunResult, TaskSpec

class Leaky(HarnessFreeBenchmark):
    def __init__(self, key):
        self.key = key
    def load_tasks(self, req):
        return [TaskSpec("t0"), TaskSpec("t1"), TaskSpec("t2")]
    def run_task(self, task, prepared, env, req, plan):
        logging.getLogger("leaky").warning("calling the model with key %s", self.key)
        print(f"printed key {self.key}")
        if task.task_id == "t0":
            raise PermissionError(f"401: key {self.key} was refused")
        return RunResult(task.task_id, output=f"answer signed with {self.key}")
    def evaluate(self, task, prepared, result, req, plan, env=None):
        return dataclasses.replace(result, score=0.0 if task.task_id == "t1" else 1.0)
"""


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["in-process", "xdist"])
def test_secrets_are_masked_in_every_report(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, workers: list[str]
) -> None:
    secret = "sk-live-0123456789"
    monkeypatch.setenv("LEAKY_KEY", secret)
    pytester.makepyfile(leaky=LEAKY)
    request = {"name": "r", "benchmark": {"id": "leaky.py:Leaky", "params": {"key": "${LEAKY_KEY}"}}}
    write_config(pytester, [request])
    result = pytester.runpytest_subprocess(
        "--agentcompass=agentcompass.yaml", "-rA", "--junitxml=j.xml", "-o", "junit_logging=all", *workers
    )
    result.assert_outcomes(passed=1, failed=1, errors=1)
    out = result.stdout.str() + result.stderr.str()
    junit = (pytester.path / "j.xml").read_text()
    assert secret not in out and secret not in junit
    assert "key *** was refused" in out and "answer signed with ***" in out
    assert "key *** was refused" in junit and "calling the model with key ***" in junit
    for path in (pytester.path / "runs").rglob("*"):
        assert not path.is_file() or secret not in path.read_text(), path


def test_secrets_are_masked_in_errors_outside_tasks(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    # Three places a ${VAR} value surfaced before: a collection error (a component id built from it),
    # the summary's preflight reason, and the usage error of an unusable output_dir.
    secret = "sk-live-9876543210"
    monkeypatch.setenv("LEAKY_KEY", secret)
    pytester.makepyfile(leaky=LEAKY)
    requests = [
        {"name": "bad", "benchmark": {"id": "leaky_${LEAKY_KEY}.py:Leaky"}},
        {
            "name": "pre",
            "benchmark": {"id": "leaky.py:Leaky", "params": {"key": "k"}},
            "environment": {"id": "docker", "params": {"image": "img-${LEAKY_KEY}"}},
        },
    ]
    write_config(pytester, requests)
    result = pytester.runpytest_subprocess(
        "--agentcompass=agentcompass.yaml", "-rA", "--junitxml=j.xml", "--continue-on-collection-errors"
    )
    out = result.stdout.str() + result.stderr.str()
    assert secret not in out and secret not in (pytester.path / "j.xml").read_text()
    result.stdout.fnmatch_lines(["*no such file 'leaky_***.py'*", "*docker*img-****"])

    write_config(pytester, requests[1:], output_dir="/proc/${LEAKY_KEY}")
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert secret not in result.stdout.str() + result.stderr.str()
    result.stderr.fnmatch_lines(["*cannot write the run directory /proc/***/*"])


@pytest.mark.parametrize("environment", ["local", "docker"])
def test_a_secret_cut_by_an_output_cap_is_masked_in_pieces(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, environment: str
) -> None:
    # The cap cuts inside the secret: what is left of it is still a secret.
    if environment == "docker" and not os.environ.get("CI"):
        probe = subprocess.run(["docker", "image", "inspect", "agentcompass-busybox:test"], capture_output=True)
        if probe.returncode:
            pytest.skip("no Docker engine with the test image (run scripts/start-docker.sh)")
    secret = "Q7" + "x9Zk" * 29 + "E"
    monkeypatch.setenv("LONG_TOKEN", secret)
    pytester.makepyfile(
        cut="""
        import dataclasses
        from pytest_agentcompass import HarnessFreeBenchmark, RunResult, TaskSpec
        class Cut(HarnessFreeBenchmark):
            evaluation_environment_mode = "none"
            def __init__(self, token):
                super().__init__(token=token)
                self.token = token
            def load_tasks(self, req):
                return [TaskSpec("t0")]
            async def run_task(self, task, prepared, env, req, plan):
                out = await env.exec(["sh", "-c", f"printf '%0150d' 0; echo {self.token}; printf '%0150d' 0"])
                assert out.stdout_truncated
                return RunResult(task.task_id, output=out.stdout)
            def evaluate(self, task, prepared, result, req, plan, env=None):
                return dataclasses.replace(result, score=0.0)
        """
    )
    env: dict[str, object] = {"id": environment, "params": {"output_limit": 200}}
    if environment == "docker":
        env["params"] = {"output_limit": 200, "image": "agentcompass-busybox:test"}
    request = {"name": "r", "benchmark": {"id": "cut.py:Cut", "params": {"token": "${LONG_TOKEN}"}}, "environment": env}
    write_config(pytester, [request])
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-rA", "--junitxml=j.xml")
    result.assert_outcomes(failed=1)
    pieces = (secret[:8], secret[-8:])
    texts = [result.stdout.str(), result.stderr.str(), (pytester.path / "j.xml").read_text()]
    texts += [p.read_text() for p in (pytester.path / "runs").rglob("*") if p.is_file()]
    assert not [t for t in texts for piece in pieces if piece in t]
    result.stdout.fnmatch_lines(["*0000****"])


def test_a_secret_quoted_in_json_is_masked_whole() -> None:
    """JSON escapes a secret's quotes and backslashes: ``P@ss<w>&\\"r\\\\d1234`` kept three characters."""
    from pytest_agentcompass.vocabulary.redact import Redactor

    secret = 'P@ss<w>&"r\\d1234'
    message = "bad payload " + json.dumps({"k": secret}) + " and " + json.dumps({"k": secret}, ensure_ascii=False)
    assert Redactor([secret]).text(message) == 'bad payload {"k": "***"} and {"k": "***"}'
