"""``-n`` through pytest-xdist: workers run their tasks concurrently under run-wide limits,
the controller owns the run directories (resume, carry-over, finalization, hooks)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from conftest import GUARD, SUITES, start_pytest, tracing_request, write_config
from tracing import read_trace


def max_open(trace: Path) -> int:
    """The most task Environments open at once, over every process (the trace is one file)."""
    current = peak = 0
    for event in read_trace(trace):
        if event["event"] == "env_open":
            current += 1
            peak = max(peak, current)
        elif event["event"] == "env_close":
            current -= 1
    return peak


def only_run(pytester: pytest.Pytester, name: str) -> Path:
    (run,) = (pytester.path / "runs" / name).iterdir()
    return run


def run_info(run: Path) -> dict[str, Any]:
    return dict(json.loads((run / "run_info.json").read_text()))


#: A conftest with which the controller (not a worker) writes the name of every detail file it reads
#: to ``detail-reads.txt``, one per line.
COUNT_DETAIL_READS = """
import os
import pytest_agentcompass.runtime.store.details as details

def pytest_configure(config):
    if hasattr(config, "workerinput"):
        return
    original = details.read_json
    def counted(path):
        if os.path.basename(os.path.dirname(str(path))) == "details":
            with open(os.path.join(str(config.rootpath), "detail-reads.txt"), "a") as fh:
                fh.write(os.path.basename(str(path)) + "\\n")
        return original(path)
    details.read_json = counted
"""


def detail_reads(pytester: pytest.Pytester) -> list[str]:
    """The detail files the controller read since the last call (see :data:`COUNT_DETAIL_READS`)."""
    log = pytester.path / "detail-reads.txt"
    if not log.exists():
        return []
    names = sorted(log.read_text().split())
    log.unlink()
    return names


def test_tasks_run_on_workers_and_the_controller_summarizes(pytester: pytest.Pytester, trace: Path) -> None:
    write_config(
        pytester,
        [tracing_request("a", trace, n=4, wrong=["t1"]), tracing_request("b", trace, n=2, fail={"run": {"t0": -1}})],
    )
    result = pytester.runpytest_subprocess(
        "--agentcompass=agentcompass.yaml", "-n", "2", "--junitxml=j.xml", timeout=GUARD
    )
    result.assert_outcomes(passed=4, failed=1, errors=1)
    result.stdout.fnmatch_lines(
        ["*a: 4 tasks, 3 passed, 1 failed, 0 errors*", "*b: 2 tasks, 1 passed, 0 failed, 1 error*"]
    )
    pids = {e["pid"] for e in read_trace(trace) if e["event"] == "run_task"}
    assert len(pids) == 2, "both workers ran tasks"
    run_a, run_b = only_run(pytester, "a"), only_run(pytester, "b")
    assert run_a.name == run_b.name, "one run id for every worker"
    summary = json.loads((run_a / "summary.json").read_text())
    assert [t["task_id"] for t in summary["tasks"]] == ["t0", "t1", "t2", "t3"]
    assert summary["metrics"]["passed"] == 3
    assert run_info(run_a)["status"] == "completed"
    props = [p.get("name") for p in ET.parse(pytester.path / "j.xml").getroot().iter("property")]
    assert props.count("agentcompass.status") == 6


def test_the_controller_finalizes_from_the_details_the_workers_sent(pytester: pytest.Pytester, trace: Path) -> None:
    # Reading every detail back from disk cost the controller ~0.8 s per 10,000 tasks, after
    # the last one, on the run's critical path: the workers send what they wrote instead.
    pytester.makeconftest(COUNT_DETAIL_READS)
    write_config(pytester, [tracing_request("a", trace, n=6, wrong=["t1"])])
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-n", "2", timeout=GUARD)
    result.assert_outcomes(passed=5, failed=1)
    result.stdout.fnmatch_lines(["*a: 6 tasks, 5 passed, 1 failed, 0 errors*"])
    assert detail_reads(pytester) == [], "no detail read back by the controller"
    run = only_run(pytester, "a")
    summary = json.loads((run / "summary.json").read_text())
    assert [(t["task_id"], t["passed"]) for t in summary["tasks"]] == [(f"t{i}", i != 1) for i in range(6)]
    assert summary["metrics"]["passed"] == 5
    page = (run / "report.html").read_text()
    assert all(f'"details/t{i}.json"' in page for i in range(6)), "the page shows every task"


def test_details_past_what_a_worker_keeps_are_read_from_disk(pytester: pytest.Pytester, trace: Path) -> None:
    # Agent trajectories can make gigabytes of details: past its budget a worker sends none.
    pytester.makeconftest(
        COUNT_DETAIL_READS
        + "\nimport pytest_agentcompass.runtime.store.details as store_details\nstore_details.KEEP_WRITTEN_CHARS = 10\n"
    )
    write_config(pytester, [tracing_request("a", trace, n=4, wrong=["t1"])])
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-n", "2", timeout=GUARD)
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines(["*a: 4 tasks, 3 passed, 1 failed, 0 errors*"])
    assert detail_reads(pytester) == [f"t{i}.json" for i in range(4)]
    summary = json.loads((only_run(pytester, "a") / "summary.json").read_text())
    assert summary["metrics"]["passed"] == 3


def test_workers_run_tasks_concurrently_up_to_the_run_wide_limit(pytester: pytest.Pytester, trace: Path) -> None:
    # Every task waits in run_task until 4 are in it at once: the run can only
    # finish if the two workers together run 4 tasks concurrently.
    barrier = pytester.mkdir("barrier")
    write_config(
        pytester,
        [tracing_request("a", trace, n=16, barrier={"dir": str(barrier), "count": 4})],
        task_concurrency=4,
    )
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-n", "2", timeout=GUARD)
    result.assert_outcomes(passed=16)
    assert max_open(trace) == 4, "task_concurrency is run-wide: never more than 4 at once over both workers"
    assert len({e["pid"] for e in read_trace(trace) if e["event"] == "run_task"}) == 2


def test_provider_capacity_is_run_wide(pytester: pytest.Pytester, trace: Path) -> None:
    write_config(
        pytester,
        [tracing_request("a", trace, n=8, sleep={"run": 0.05}, environment={"capacity": 1})],
        task_concurrency=8,
    )
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-n", "2", timeout=GUARD)
    result.assert_outcomes(passed=8)
    assert max_open(trace) == 1


def test_plain_tests_and_tasks_together_under_xdist(pytester: pytest.Pytester, trace: Path) -> None:
    pytester.makepyfile(
        test_unit="""
        import pytest

        @pytest.fixture(scope="session")
        def resource():
            return 41

        @pytest.mark.parametrize("i", range(3))
        def test_unit(resource, i):
            assert resource + 1 == 42
        """
    )
    write_config(pytester, [tracing_request("a", trace, n=6, sleep={"run": 0.05})])
    result = pytester.runpytest_subprocess(
        "--agentcompass=agentcompass.yaml", "test_unit.py", "-n", "2", "-v", timeout=GUARD
    )
    result.assert_outcomes(passed=9)
    result.stdout.fnmatch_lines(["*PASSED test_unit.py::test_unit?0?*", "*PASSED agentcompass.yaml::a::t5*"])


def test_carry_over_resume_and_last_failed_under_xdist(pytester: pytest.Pytester, trace: Path) -> None:
    write_config(pytester, [tracing_request("a", trace, n=6, wrong=["t2"])])
    first = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-n", "2", timeout=GUARD)
    first.assert_outcomes(passed=5, failed=1)
    ran = len([e for e in read_trace(trace) if e["event"] == "run_task"])
    assert ran == 6

    carried = pytester.runpytest_subprocess(
        "--agentcompass=agentcompass.yaml", "-n", "2", "--agentcompass-carry-over=latest", timeout=GUARD
    )
    carried.assert_outcomes(passed=5, failed=1)
    carried.stdout.fnmatch_lines(["*a: 6 tasks, 5 passed, 1 failed, 0 errors, 6 carried over*"])
    assert len([e for e in read_trace(trace) if e["event"] == "run_task"]) == ran, "nothing ran again"

    last_failed = pytester.runpytest_subprocess(
        "--agentcompass=agentcompass.yaml", "-n", "2", "--lf", "--agentcompass-carry-over=latest", timeout=GUARD
    )
    last_failed.assert_outcomes(failed=1)
    runs = [e["task"] for e in read_trace(trace) if e["event"] == "run_task"][ran:]
    assert runs == ["t2"], "--lf reruns the failed task only"


def test_hooks_fire_under_xdist(pytester: pytest.Pytester, trace: Path) -> None:
    pytester.makeconftest(
        """
        import json, os

        def pytest_agentcompass_task_finished(item, outcome):
            with open("finished.log", "a") as fh:
                fh.write(f"{os.getpid()} {outcome.task.task_id}\\n")

        def pytest_agentcompass_request_finalized(request, summary):
            with open("finalized.log", "a") as fh:
                fh.write(json.dumps({"pid": os.getpid(), "request": request, "counts": summary["counts"]}) + "\\n")
        """
    )
    write_config(pytester, [tracing_request("a", trace, n=4), tracing_request("b", trace, n=2)])
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-n", "2", timeout=GUARD)
    result.assert_outcomes(passed=6)
    finished = (pytester.path / "finished.log").read_text().split()
    assert sorted(finished[1::2]) == ["t0", "t0", "t1", "t1", "t2", "t3"]
    finalized = [json.loads(line) for line in (pytester.path / "finalized.log").read_text().splitlines()]
    assert [f["request"] for f in finalized] == ["a", "b"], "once per request, in the controller"
    workers = {e["pid"] for e in read_trace(trace) if e["event"] == "run_task"}
    (controller,) = {f["pid"] for f in finalized}
    assert controller not in workers
    assert {int(pid) for pid in finished[0::2]} <= workers, "task_finished fires where the task ran"
    assert finalized[0]["counts"]["passed"] == 4


def test_exit_first_under_xdist_stops_and_records_it(pytester: pytest.Pytester, trace: Path) -> None:
    write_config(pytester, [tracing_request("a", trace, n=12, wrong=["t0"])], task_concurrency=1)
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-n", "2", "-x", timeout=GUARD)
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed") == 1
    assert outcomes.get("errors", 0) == 0, "what never started is not reported, as with xdist's own loop"
    assert len([e for e in read_trace(trace) if e["event"] == "run_task"]) < 12
    info = run_info(only_run(pytester, "a"))
    assert info["status"] == "stopped"


def _wait_for_event(trace: Path, proc: subprocess.Popen[str], event: str) -> dict[str, Any]:
    import time

    while True:
        found = [e for e in read_trace(trace) if e["event"] == event]
        if found:
            return found[0]
        if proc.poll() is not None:
            raise AssertionError(f"pytest ended before {event}:\n{proc.stdout.read() if proc.stdout else ''}")
        time.sleep(0.05)


def test_a_killed_worker_gives_its_permits_back_and_the_run_resumes(pytester: pytest.Pytester, trace: Path) -> None:
    # One permit for the whole run. The worker holding it is killed (-9) while
    # its task hangs; if its permit leaked, nothing else could ever run.
    flag = pytester.path / "hang"
    flag.touch()
    write_config(
        pytester,
        [tracing_request("a", trace, n=4, hang_if={"file": str(flag)})],
        task_concurrency=1,
    )
    pytester.makeconftest(COUNT_DETAIL_READS)
    proc = start_pytest(pytester, "-n", "2", own_group=True)
    holder = _wait_for_event(trace, proc, "run_task")
    flag.unlink()  # tasks that start from now on do not hang
    os.kill(holder["pid"], signal.SIGKILL)
    out, _ = proc.communicate(timeout=GUARD)
    assert "crashed while running" in out and f"{holder['task']}" in out, out
    assert "3 passed" in out, out
    run = only_run(pytester, "a")
    info = run_info(run)
    assert info["status"] == "interrupted", info
    assert info["unfinished_tasks"] == [holder["task"]]
    done = sorted(f"t{i}.json" for i in range(4) if f"t{i}" != holder["task"])
    # A lost worker sent nothing: the controller read what is on disk, and looked up the crashed
    # task's detail once when xdist reported it (none: nothing to explain).
    assert detail_reads(pytester) == sorted([*done, f"{holder['task']}.json"])

    resumed = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-n", "2", timeout=GUARD)
    resumed.assert_outcomes(passed=4)
    resumed.stdout.fnmatch_lines(["*a: 4 tasks, 4 passed, 0 failed, 0 errors, 3 resumed*"])
    assert only_run(pytester, "a") == run, "the interrupted run was resumed, not replaced"
    assert run_info(run)["status"] == "completed"
    # The resumed details, read once as the run reopened; the task run again came from its worker.
    assert detail_reads(pytester) == done
    page = (run / "report.html").read_text()
    assert all(f'"details/t{i}.json"' in page for i in range(4)), "the page shows resumed and new tasks"
    ran = [e["task"] for e in read_trace(trace) if e["event"] == "run_task"]
    assert ran.count(holder["task"]) == 2 and len(ran) == 5, "only the lost task ran again"


def test_ctrl_c_under_xdist_leaves_an_interrupted_run_that_resumes(pytester: pytest.Pytester, trace: Path) -> None:
    flag = pytester.path / "hang"
    flag.touch()
    write_config(pytester, [tracing_request("a", trace, n=4, hang_if={"file": str(flag)})], task_concurrency=4)
    proc = start_pytest(pytester, "-n", "2", own_group=True)
    _wait_for_event(trace, proc, "run_task")
    flag.unlink()
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=GUARD)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
    assert "Traceback" not in out and "INTERNALERROR" not in out, out
    run = only_run(pytester, "a")
    assert run_info(run)["status"] == "interrupted"
    resumed = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-n", "2", timeout=GUARD)
    resumed.assert_outcomes(passed=4)
    assert only_run(pytester, "a") == run
    assert run_info(run)["status"] == "completed"


def test_a_fixture_supplied_benchmark_under_xdist(pytester: pytest.Pytester, trace: Path) -> None:
    # The controller builds the request too (to own its run): a rootdir conftest's fixture is visible to it.
    pytester.makeconftest(
        f"""
        import sys
        import pytest
        sys.path.insert(0, {str(SUITES)!r})
        from tracing import TracingBenchmark

        @pytest.fixture(scope="session")
        def traced():
            return TracingBenchmark(trace={str(trace)!r}, n=4)
        """
    )
    request = tracing_request("a", trace, n=4)
    request["benchmark"] = {"id": "fixture:traced"}
    write_config(pytester, [request])
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-n", "2", timeout=GUARD)
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["*a: 4 tasks, 4 passed, 0 failed, 0 errors*"])
    assert run_info(only_run(pytester, "a"))["status"] == "completed"


def test_carry_over_of_nothing_under_xdist_is_one_clear_error(pytester: pytest.Pytester, trace: Path) -> None:
    write_config(pytester, [tracing_request("a", trace, n=2)])
    result = pytester.runpytest_subprocess(
        "--agentcompass=agentcompass.yaml", "-n", "2", "--agentcompass-carry-over=latest", timeout=GUARD
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*carry_over: latest: no earlier run with results under*"])
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    assert not read_trace(trace) or not [e for e in read_trace(trace) if e["event"] == "run_task"]


def test_the_deadline_under_xdist_cancels_what_is_left_and_records_it(pytester: pytest.Pytester, trace: Path) -> None:
    flag = pytester.path / "hang"
    flag.touch()  # every task hangs: only the deadline ends the run
    write_config(
        pytester,
        [tracing_request("a", trace, n=4, hang_if={"file": str(flag)})],
        task_concurrency=4,
        timeout_seconds=3,
        cleanup_grace_seconds=5,
    )
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-n", "2", timeout=GUARD)
    result.assert_outcomes(errors=4)
    result.stdout.fnmatch_lines(["*cancelled: timeout: orchestration timeout of 3*"])
    info = run_info(only_run(pytester, "a"))
    assert info["status"] == "timeout", info
    assert sorted(info["unfinished_tasks"]) == ["t0", "t1", "t2", "t3"]


def test_a_request_that_cannot_be_built_is_one_masked_message_under_xdist(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "tok-5up3r-s3cr3t-value"
    monkeypatch.setenv("DATA_TOKEN", secret)
    pytester.makepyfile(
        ld="""
        from pytest_agentcompass import HarnessFreeBenchmark
        class Ld(HarnessFreeBenchmark):
            def __init__(self, url):
                super().__init__(url=url)
                self.url = url
            def load_tasks(self, req):
                raise ConnectionError(f"cannot download the dataset from {self.url}")
        """
    )
    request = {"name": "r", "benchmark": {"id": "ld.py:Ld", "params": {"url": "https://h/d?token=${DATA_TOKEN}"}}}
    write_config(pytester, [request])
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-n", "2", timeout=GUARD)
    out = result.stdout.str() + result.stderr.str()
    assert secret not in out
    assert "ran on the workers" not in out  # nothing ran: the collection error is the one message
    result.stdout.fnmatch_lines(["*ConnectionError: cannot download the dataset from https://h/d?token=***"])


def test_another_distribution_mode_still_prepares_and_finalizes_the_run(pytester: pytest.Pytester, trace: Path) -> None:
    # Only --dist load uses the plugin's scheduler; the run's owner must not depend on it.
    write_config(pytester, [tracing_request("a", trace, n=4, wrong=["t1"])])
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-n", "2", "--dist", "loadscope")
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines(["*a: 4 tasks, 3 passed, 1 failed, 0 errors*"])
    run = only_run(pytester, "a")
    assert run_info(run)["status"] == "completed"
    assert [t["task_id"] for t in json.loads((run / "summary.json").read_text())["tasks"]] == ["t0", "t1", "t2", "t3"]


def test_dist_each_is_refused(pytester: pytest.Pytester, trace: Path) -> None:
    write_config(pytester, [tracing_request("a", trace, n=2)])
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-n", "2", "--dist", "each")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--agentcompass with --dist each would run every task once per worker*"])
    assert not read_trace(trace) and not (pytester.path / "runs").exists()


def test_a_resumed_run_under_xdist_says_resumed_not_carried_over(pytester: pytest.Pytester, trace: Path) -> None:
    write_config(pytester, [tracing_request("a", trace, n=6, wrong=["t1"])], task_concurrency=1)
    first = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-x", timeout=GUARD)
    first.assert_outcomes(passed=1, failed=1)  # t0, t1, then -x stops the run
    resumed = pytester.runpytest_subprocess(
        "--agentcompass=agentcompass.yaml", "-n", "2", "--junitxml=j.xml", timeout=GUARD
    )
    resumed.assert_outcomes(passed=5, failed=1)
    resumed.stdout.fnmatch_lines(
        ["*agentcompass: a: resuming *(2 of 6 tasks done)*", "*a: 6 tasks, 5 passed, 1 failed, 0 errors, 2 resumed*"]
    )
    assert " carried over" not in resumed.stdout.str() and "carried over from" not in resumed.stdout.str()
    props = {p.get("name"): p.get("value") for p in ET.parse(pytester.path / "j.xml").iter("property")}
    assert props.get("agentcompass.carried_over") in (None, "False")


def test_ctrl_c_on_the_controller_alone_cancels_the_workers_tasks(pytester: pytest.Pytester, trace: Path) -> None:
    # `kill -INT <controller>`: the workers never see the signal; the controller tells them.
    flag = pytester.path / "hang"
    flag.touch()
    write_config(
        pytester,
        [tracing_request("a", trace, n=4, hang_if={"file": str(flag)})],
        task_concurrency=4,
        cleanup_grace_seconds=30,
    )
    proc = start_pytest(pytester, "-n", "2", own_group=True)
    _wait_for_event(trace, proc, "run_task")
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=GUARD)  # the tasks hang for good: only a cancel ends them
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
    assert "Traceback" not in out and "INTERNALERROR" not in out, out
    assert "a: 4 tasks, 0 passed, 0 failed, 4 errors" in out, out
    assert "= 4 errors in" in out, out  # pytest's own count agrees
    run = only_run(pytester, "a")
    assert run_info(run)["status"] == "interrupted"
    flag.unlink()
    resumed = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-n", "2", timeout=GUARD)
    resumed.assert_outcomes(passed=4)
    assert only_run(pytester, "a") == run


HANGING = """
import asyncio, os
from pytest_agentcompass import HarnessFreeBenchmark, RunResult, TaskSpec

class Hanging(HarnessFreeBenchmark):
    evaluation_environment_mode = "none"
    def load_tasks(self, req):
        return [TaskSpec(f"t{i}") for i in range(8)]
    async def run_task(self, task, prepared, env, req, plan):
        open(os.path.join(os.environ["HANGING_DIR"], task.task_id), "w").close()
        await asyncio.sleep(3600)
    async def evaluate(self, task, prepared, result, req, plan, env=None):
        return result
"""


@pytest.mark.parametrize("exit_first", [False, True])
def test_an_interrupted_distributed_run_counts_every_task_as_in_process(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exit_first: bool
) -> None:
    """Running and never-started tasks are errors in pytest's counts and in junit, not missing."""
    started = tmp_path / "started"
    started.mkdir()
    monkeypatch.setenv("HANGING_DIR", str(started))
    pytester.makepyfile(hanging=HANGING)
    write_config(pytester, [{"name": "h", "benchmark": {"id": "hanging.py:Hanging"}}], task_concurrency=2)
    proc = start_pytest(pytester, "-n", "2", "--junitxml=j.xml", *(["-x"] if exit_first else []), own_group=True)
    deadline = time.monotonic() + GUARD
    while len(list(started.iterdir())) < 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=GUARD)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
    assert "h: 8 tasks, 0 passed, 0 failed, 8 errors" in out, out
    assert "= 8 errors in" in out, out
    for i in range(8):  # each with its reason in the short summary, the ones no worker reached too
        assert f"ERROR agentcompass.yaml::h::t{i} - cancelled: interrupted by the user" in out, out
    suite = ET.parse(pytester.path / "j.xml").getroot().find("testsuite")
    assert suite is not None
    assert (suite.get("tests"), suite.get("errors")) == ("8", "8")
    assert "Traceback" not in out and "INTERNALERROR" not in out, out
    # Those errors count towards -x in pytest's session: the run was still interrupted, not stopped.
    assert run_info(only_run(pytester, "h"))["status"] == "interrupted"


def test_a_worker_slow_to_wind_down_ends_without_noise(pytester: pytest.Pytester, trace: Path) -> None:
    """xdist ends the workers' gateways once all said they finished, and execnet sends a worker that is
    still busy 5 s later SIGINT. What a worker does after that point (other plugins' terminal summaries,
    pytest's collections) can take that long on a loaded machine: it must end quietly, run recorded."""
    write_config(pytester, [tracing_request("a", trace, n=2)])
    pytester.makeconftest(
        """
import os, time

def pytest_terminal_summary(terminalreporter):
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        time.sleep(7)  # past execnet's 5 s, within xdist's 10 s before it kills the worker
        open(f"wound-down-{worker}", "w").close()
"""
    )
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-n", "2", timeout=GUARD)
    result.assert_outcomes(passed=2)
    assert result.ret == 0
    out = result.stdout.str() + result.stderr.str()
    for noise in ("KeyboardInterrupt", "Exception ignored", "Traceback"):
        assert noise not in out, out
    assert run_info(only_run(pytester, "a"))["status"] == "completed"
    # Interrupted, the sleep ended at 5 s with a KeyboardInterrupt that nothing printed.
    assert sorted(p.name for p in pytester.path.glob("wound-down-*")) == ["wound-down-gw0", "wound-down-gw1"]


LOST_AFTER_RECORDING = """
import asyncio, dataclasses, glob, os, signal
from pytest_agentcompass import HarnessFreeBenchmark, RunResult, TaskSpec


class Lost(HarnessFreeBenchmark):
    evaluation_environment_mode = "none"

    def load_tasks(self, req):
        return [TaskSpec(task_id=f"t{i}") for i in range(3)]

    async def run_task(self, task, prepared, env, req, plan):
        if task.task_id == "t1" and not os.path.exists("killed-once"):
            # t0 is recorded; its reports are held back (conftest): the worker dies before sending them.
            while not glob.glob("runs/lost/*/details/t0.json"):
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.3)
            open("killed-once", "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return RunResult(task_id=task.task_id, output="ok")

    def evaluate(self, task, prepared, result, req, plan, env=None):
        return dataclasses.replace(result, score=1.0)
"""


def test_a_task_recorded_before_its_worker_was_lost_is_explained(pytester: pytest.Pytester) -> None:
    # xdist reports the task its lost worker was on as crashed; the run counts what was recorded
    # (a resume keeps it), and the summary says why the two counts differ.
    pytester.makepyfile(lost=LOST_AFTER_RECORDING)
    pytester.makeconftest(
        "import time\n"
        "def pytest_runtest_logstart(nodeid):\n"
        "    if nodeid.endswith('::t0') and not __import__('os').path.exists('killed-once'):\n"
        "        time.sleep(5)  # on the worker: t0's reports wait while t1 kills the worker\n"
    )
    write_config(pytester, [{"name": "lost", "benchmark": {"id": "lost.py:Lost"}}], task_concurrency=3)
    result = pytester.runpytest_subprocess(
        "--agentcompass=agentcompass.yaml", "-n", "1", "-p", "no:randomly", timeout=GUARD
    )
    result.stdout.fnmatch_lines(
        [
            "*worker 'gw0' crashed while running '*::lost::t0'*",
            "lost: 3 tasks, 3 passed, 0 failed, 0 errors",
            "*note: task t0 has a record in the run directory, but its worker was lost before reporting it:"
            " pytest reports it as crashed, this summary counts the record*",
        ]
    )
    result.assert_outcomes(passed=2, failed=1)
