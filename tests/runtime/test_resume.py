"""Checkpoints, resume, carry-over and finalization: results are never lost, duplicated or double-counted."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pytest_agentcompass.runtime.store.details import DetailFiles

from conftest import tracing_request, write_config
from tracing import read_trace


def run_dirs(pytester: pytest.Pytester, name: str = "r") -> list[Path]:
    # Names starting with "." are runs still being created (renamed into place when whole).
    folder = pytester.path / "runs" / name
    if not folder.is_dir():  # a process killed before it made its first run directory
        return []
    return sorted(p for p in folder.iterdir() if not p.name.startswith("."))


def details(run_dir: Path) -> dict[str, dict[str, Any]]:
    """Every readable detail of ``run_dir``, by task, in whichever layout the run keeps them."""
    return {d["task_id"]: d for d in DetailFiles(run_dir).iter_details()}


def test_interrupted_k3_task_resumes_only_missing_attempts(pytester: pytest.Pytester, trace: Path) -> None:
    hang = pytester.path / "hang"
    hang.touch()
    request = tracing_request(
        "r", trace, n=2, hang_if={"file": str(hang), "attempts": [2]}, execution={"attempts": {"k": 3}}
    )
    write_config(pytester, [request], timeout_seconds=2, cleanup_grace_seconds=5)
    pytester.runpytest("--agentcompass=agentcompass.yaml").assert_outcomes(errors=2)
    (run_dir,) = run_dirs(pytester)
    assert json.loads((run_dir / "run_info.json").read_text())["status"] == "timeout"
    assert sorted(p.name for p in (run_dir / "checkpoints/t0").iterdir()) == ["attempt-0.json", "attempt-1.json"]

    hang.unlink()
    trace.unlink()
    result = pytester.runpytest("--agentcompass=agentcompass.yaml")
    result.assert_outcomes(passed=2)
    assert run_dirs(pytester) == [run_dir]  # resumed in place
    ran = Counter((e["task"], e["attempt"]) for e in read_trace(trace) if e["event"] == "run_task")
    assert ran == {("t0", 2): 1, ("t1", 2): 1}
    found = details(run_dir)
    assert {k: sorted(v["attempt_results"]) for k, v in found.items()} == {"t0": ["0", "1", "2"], "t1": ["0", "1", "2"]}
    assert not (run_dir / "checkpoints/t0").exists()
    info = json.loads((run_dir / "run_info.json").read_text())
    assert info["status"] == "completed" and len(info["resumed_at"]) == 1


def test_finished_run_is_not_resumed(pytester: pytest.Pytester, trace: Path) -> None:
    write_config(pytester, [tracing_request("r", trace, n=2)])
    pytester.runpytest("--agentcompass=agentcompass.yaml").assert_outcomes(passed=2)
    pytester.runpytest("--agentcompass=agentcompass.yaml").assert_outcomes(passed=2)
    assert len(run_dirs(pytester)) == 2


def test_incompatible_checkpoints_are_ignored_with_a_note(pytester: pytest.Pytester, trace: Path) -> None:
    tasks = pytester.path / "tasks.json"
    tasks.write_text(json.dumps(["one", "two"]))
    pytester.makepyfile(
        bench=f"""
        import asyncio, dataclasses, json, os
        from pytest_agentcompass import HarnessFreeBenchmark, RunResult, TaskSpec
        class B(HarnessFreeBenchmark):
            def load_tasks(self, req):
                return [TaskSpec(f"t{{i}}", question=q) for i, q in enumerate(json.load(open({str(tasks)!r})))]
            async def run_task(self, task, prepared, env, req, plan):
                if plan.attempt_index == 1 and os.path.exists("hang"):
                    await asyncio.sleep(3600)
                with open("ran.log", "a") as fh:
                    fh.write(f"{{task.task_id}} {{plan.attempt_index}}\\n")
                return RunResult(task.task_id, output=task.question)
            def evaluate(self, task, prepared, result, req, plan, env=None):
                return dataclasses.replace(result, score=1.0)
        """
    )
    (pytester.path / "hang").touch()
    write_config(
        pytester,
        [{"name": "r", "benchmark": {"id": "bench.py:B"}, "execution": {"attempts": {"k": 2}}}],
        timeout_seconds=1.5,
        cleanup_grace_seconds=5,
    )
    pytester.runpytest("--agentcompass=agentcompass.yaml").assert_outcomes(errors=2)
    (pytester.path / "hang").unlink()
    (pytester.path / "ran.log").unlink()
    tasks.write_text(json.dumps(["one", "changed"]))  # t1's content changed: its checkpoint is stale
    result = pytester.runpytest("--agentcompass=agentcompass.yaml")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*note: task t1: ignored 1 incompatible checkpoint(s)*"])
    assert sorted((pytester.path / "ran.log").read_text().split("\n")[:-1]) == ["t0 1", "t1 0", "t1 1"]


def test_carry_over_latest_skips_finished_tasks(pytester: pytest.Pytester, trace: Path) -> None:
    write_config(pytester, [tracing_request("r", trace, n=3, wrong=["t1"])])
    pytester.runpytest("--agentcompass=agentcompass.yaml").assert_outcomes(passed=2, failed=1)
    trace.unlink()
    result = pytester.runpytest(
        "--agentcompass=agentcompass.yaml", "--agentcompass-carry-over=latest", "--junitxml=j.xml"
    )
    result.assert_outcomes(passed=2, failed=1)
    assert [e for e in read_trace(trace) if e["event"] == "run_task"] == []
    first, second = run_dirs(pytester)
    assert sorted(details(second)) == ["t0", "t1", "t2"]
    assert 'name="agentcompass.carried_over" value="True"' in (pytester.path / "j.xml").read_text()
    result.stdout.fnmatch_lines(
        ["r: 3 tasks, 2 passed, 1 failed, 0 errors, 3 carried over", f"  note: carried over 3 task(s) from {first}"]
    )
    assert json.loads((second / "run_info.json").read_text())["carried_over_from"] == str(first)


def test_a_detail_that_is_no_record_reads_as_a_task_not_done(pytester: pytest.Pytester, trace: Path) -> None:
    # A file in details/ that holds a list, or a record with a status no result has (edited by
    # hand, or forged with the right fingerprint), is no result, whether the run is resumed or
    # carried over: the task runs again, the session ends normally.
    write_config(pytester, [tracing_request("r", trace, n=3)])
    pytester.runpytest("--agentcompass=agentcompass.yaml").assert_outcomes(passed=3)
    (first,) = run_dirs(pytester)
    (first / "details" / "t1.json").write_text("[1, 2]")
    forged = json.loads((first / "details" / "t0.json").read_text())
    (first / "details" / "t0.json").write_text(json.dumps({**forged, "status": "bogus"}))
    trace.unlink()
    result = pytester.runpytest("--agentcompass=agentcompass.yaml", "--agentcompass-carry-over=latest")
    result.assert_outcomes(passed=3)
    assert sorted(e["task"] for e in read_trace(trace) if e["event"] == "run_task") == ["t0", "t1"]
    result.stdout.fnmatch_lines([f"  note: 2 detail(s) in {first} not carried over*"])

    _, second = run_dirs(pytester)
    (second / "details" / "t2.json").write_text('"done"')
    forged = json.loads((second / "details" / "t1.json").read_text())
    (second / "details" / "t1.json").write_text(json.dumps({**forged, "status": "bogus"}))
    info = json.loads((second / "run_info.json").read_text())
    (second / "run_info.json").write_text(json.dumps({**info, "status": "timeout"}))  # resumable
    trace.unlink()
    result = pytester.runpytest("--agentcompass=agentcompass.yaml")
    result.assert_outcomes(passed=3)
    assert sorted(e["task"] for e in read_trace(trace) if e["event"] == "run_task") == ["t1", "t2"]
    assert len(run_dirs(pytester)) == 2, "resumed in place"
    assert details(second)["t2"]["task_id"] == "t2", "the resumed run wrote the task's record again"
    assert details(second)["t1"]["status"] == "scored"
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


def test_errors_are_not_carried_over(pytester: pytest.Pytester, trace: Path) -> None:
    write_config(pytester, [tracing_request("r", trace, n=2, fail={"run": {"t1": 1}})])
    pytester.runpytest("--agentcompass=agentcompass.yaml").assert_outcomes(passed=1, errors=1)
    trace.unlink()
    # t1 errors again (the injected failure is per process), but it was run again, not carried over.
    result = pytester.runpytest("--agentcompass=agentcompass.yaml", "--agentcompass-carry-over=latest")
    result.assert_outcomes(passed=1, errors=1)
    assert [e["task"] for e in read_trace(trace) if e["event"] == "run_task"] == ["t1"]


def test_last_failed_with_carry_over_reruns_failures_and_keeps_the_rest(pytester: pytest.Pytester, trace: Path) -> None:
    write_config(pytester, [tracing_request("r", trace, n=4, wrong=["t2"])])
    pytester.runpytest("--agentcompass=agentcompass.yaml").assert_outcomes(passed=3, failed=1)
    trace.unlink()
    result = pytester.runpytest("--agentcompass=agentcompass.yaml", "--lf", "--agentcompass-carry-over=latest")
    result.assert_outcomes(failed=1, deselected=3)
    assert [e["task"] for e in read_trace(trace) if e["event"] == "run_task"] == ["t2"]
    _, second = run_dirs(pytester)
    summary = json.loads((second / "summary.json").read_text())
    assert [t["task_id"] for t in summary["tasks"]] == ["t0", "t1", "t2", "t3"]
    assert summary["counts"]["carried_over"] == 3
    first_run, _ = run_dirs(pytester)
    for task_id in ("t0", "t1", "t3"):  # taken over as they were, not run again
        assert (second / f"details/{task_id}.json").read_bytes() == (first_run / f"details/{task_id}.json").read_bytes()
    assert details(second)["t2"]["status"] == "scored" and details(second)["t2"]["score"] == 0.0


def test_carry_over_of_a_missing_run_is_a_clear_error(pytester: pytest.Pytester, trace: Path) -> None:
    write_config(pytester, [tracing_request("r", trace, n=1)])
    result = pytester.runpytest("--agentcompass=agentcompass.yaml", "--agentcompass-carry-over=latest")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*carry_over: latest: no earlier run with results under*"])


def test_summary_is_in_task_order_with_pass_at_k(pytester: pytest.Pytester, trace: Path) -> None:
    write_config(
        pytester,
        [tracing_request("r", trace, n=5, wrong=["t3"], sleep={"run": 0.05}, execution={"attempts": {"k": 2}})],
    )
    pytester.runpytest("--agentcompass=agentcompass.yaml").assert_outcomes(passed=4, failed=1)
    (run_dir,) = run_dirs(pytester)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [t["task_id"] for t in summary["tasks"]] == ["t0", "t1", "t2", "t3", "t4"]
    assert summary["metrics"]["pass@2"] == 0.8 and summary["metrics"]["k"] == 2


def test_pass_strategy_stops_at_the_first_pass(pytester: pytest.Pytester, trace: Path) -> None:
    write_config(
        pytester,
        [tracing_request("r", trace, n=2, fail={"run": 1}, execution={"attempts": {"k": 3, "strategy": "pass"}})],
    )
    pytester.runpytest("--agentcompass=agentcompass.yaml").assert_outcomes(passed=2)
    attempts = Counter(e["attempt"] for e in read_trace(trace) if e["event"] == "run_task")
    assert attempts == {0: 2, 1: 2}  # attempt 0 errored (no retries), attempt 1 passed, attempt 2 never ran


# -- kill -9 at random points -------------------------------------------------------------
def _pytest_cmd(path: Path) -> list[str]:
    return [sys.executable, "-m", "pytest", "--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider", "-q"]


def _aggregate(run_dir: Path) -> dict[str, Any]:
    found = details(run_dir)
    return {k: (v["score"], v["passed"], sorted(v["attempt_results"])) for k, v in sorted(found.items())}


@pytest.mark.parametrize("layout", ["files", "journal"])
def test_kill_9_at_random_points_then_resume(pytester: pytest.Pytester, tmp_path: Path, layout: str) -> None:
    n, k = 40, 2
    wrong = ["t3", "t7", "t19"]

    ws = pytester.path / "ws"
    ws.mkdir()

    def config(trace: Path) -> None:
        request = tracing_request(
            "r",
            trace,
            n=n,
            wrong=wrong,
            sleep={"run": 0.25},
            execution={"attempts": {"k": k}, "details_layout": layout},
            env_params={"base_dir": str(ws)},
        )
        write_config(pytester, [request], task_concurrency=4)

    # The reference: one uninterrupted run.
    config(tmp_path / "reference.jsonl")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run(_pytest_cmd(pytester.path), cwd=pytester.path, env=env, capture_output=True, check=False)
    (reference_dir,) = run_dirs(pytester)
    reference = _aggregate(reference_dir)
    reference_summary = json.loads((reference_dir / "summary.json").read_text())
    assert len(reference) == n
    import shutil

    shutil.rmtree(pytester.path / "runs")

    rng = random.Random(1234)
    trace = tmp_path / "killed.jsonl"
    config(trace)
    kills = 0
    finished = False
    for _ in range(8):
        proc = subprocess.Popen(
            _pytest_cmd(pytester.path),
            cwd=pytester.path,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        # Kill at a random point after this process has started work (its first
        # lifecycle call), however long interpreter start takes on a busy machine.
        start_size = trace.stat().st_size if trace.exists() else 0
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            if trace.exists() and trace.stat().st_size > start_size:
                break
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 1.2))
        if proc.poll() is not None:
            finished = True
            break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills += 1
        if any(json.loads((d / "run_info.json").read_text())["status"] == "completed" for d in run_dirs(pytester)):
            finished = True  # killed after finalization, while pytest was printing: nothing left to resume
            break
    if not finished:
        final = subprocess.run(_pytest_cmd(pytester.path), cwd=pytester.path, env=env, capture_output=True, text=True)
        assert "error" not in final.stdout.splitlines()[-1], final.stdout
    assert kills >= 3, "the run finished too early to test anything"
    dirs = run_dirs(pytester)
    completed = [d for d in dirs if json.loads((d / "run_info.json").read_text())["status"] == "completed"]
    assert len(completed) == 1
    run_dir = completed[0]
    assert len(dirs) == 1, "every restart resumed the same run"
    assert _aggregate(run_dir) == reference
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["metrics"] == reference_summary["metrics"]
    # A kill mid-write leaves a temp file, never a half detail; the resume removes them.
    assert not list((run_dir / "details").glob(".*.tmp")), "temp files of killed writers were removed on resume"
    assert list(ws.iterdir()) == [], "workspaces left by killed processes were swept on resume"
    for path in (run_dir / "details").glob("*.json"):
        json.loads(path.read_text())
    if layout == "journal":  # a kill mid-line leaves a line no reader counts; every task's last line is whole
        assert os.listdir(run_dir / "details") == ["journal.jsonl"]
        assert len(details(run_dir)) == n


def test_aggregate_sees_full_results_read_back_from_details(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        bench="""
        import dataclasses
        from pytest_agentcompass import HarnessFreeBenchmark, RunResult, TaskSpec
        class B(HarnessFreeBenchmark):
            def load_tasks(self, req):
                return [TaskSpec(f"t{i}") for i in range(5)]
            async def run_task(self, task, prepared, env, req, plan):
                return RunResult(task.task_id, output="x" * 1000 + task.task_id,
                                 artifacts={"file": {"a.txt": task.task_id}})
            def evaluate(self, task, prepared, result, req, plan, env=None):
                return dataclasses.replace(result, score=1.0)
            def aggregate_metrics(self, results, req):
                return {"outputs": [r.output[-2:] for r in results],
                        "artifacts": [r.artifacts["file"]["a.txt"] for r in results[1:3]]}
        """
    )
    write_config(pytester, [{"name": "r", "benchmark": {"id": "bench.py:B"}}], task_concurrency=5)
    pytester.runpytest("--agentcompass=agentcompass.yaml").assert_outcomes(passed=5)
    (summary,) = pytester.path.glob("runs/r/*/summary.json")
    metrics = json.loads(summary.read_text())["metrics"]
    assert metrics == {"outputs": ["t0", "t1", "t2", "t3", "t4"], "artifacts": ["t1", "t2"]}


def test_two_runs_in_one_second_are_told_apart_by_their_recorded_start(pytester: pytest.Pytester, trace: Path) -> None:
    # Ids of one second whose random parts sort the other way round than the runs were made.
    pytester.makeconftest(
        "import os\ndef pytest_agentcompass_make_run_id(config):\n    return os.environ.get('RUN_ID')\n"
    )
    write_config(pytester, [tracing_request("r", trace, n=2, wrong=["t1"])])
    for run_id in ("20260101T000000-ffff", "20260101T000000-0000"):
        os.environ["RUN_ID"] = run_id
        try:
            pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml").assert_outcomes(passed=1, failed=1)
        finally:
            del os.environ["RUN_ID"]
    result = pytester.runpytest("--agentcompass=agentcompass.yaml", "--agentcompass-carry-over=latest")
    result.stdout.fnmatch_lines(["*note: carried over 2 task(s) from */runs/r/20260101T000000-0000"])


def stopped_after_two_of_four(pytester: pytest.Pytester, trace: Path) -> Path:
    """A run of four tasks stopped by ``-x`` at its second (t0 passed, t1 failed): its run directory."""
    write_config(pytester, [tracing_request("r", trace, n=4, wrong=["t1"])], task_concurrency=1)
    pytester.runpytest("--agentcompass=agentcompass.yaml", "-x").assert_outcomes(passed=1, failed=1)
    (run_dir,) = run_dirs(pytester)
    return run_dir


def test_a_resume_of_a_selection_counts_the_run_and_the_selection(pytester: pytest.Pytester, trace: Path) -> None:
    # -k or --lf on a resume: the start line says how much of the run is done, and of what was asked.
    run_dir = stopped_after_two_of_four(pytester, trace)
    result = pytester.runpytest("--agentcompass=agentcompass.yaml", "-k", "t1 or t2")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([f"agentcompass: r: resuming {run_dir} (2 of 4 tasks done; 1 of the 2 selected)"])


def test_a_resume_says_what_it_resumes_not_carried_over(pytester: pytest.Pytester, trace: Path) -> None:
    run_dir = stopped_after_two_of_four(pytester, trace)
    result = pytester.runpytest("--agentcompass=agentcompass.yaml", "-rA", "--junitxml=j.xml")
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines([f"agentcompass: r: resuming {run_dir} (2 of 4 tasks done)"])
    assert "carried over from an earlier run" not in result.stdout.str()
    result.stdout.fnmatch_lines(["*kept from the interrupted run this one resumes*"])
    result.stdout.fnmatch_lines(["r: 4 tasks, 3 passed, 1 failed, 0 errors, 2 resumed"])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["counts"]["carried_over"], summary["counts"]["resumed"]) == (0, 2)
    assert "agentcompass.carried_over" not in (pytester.path / "j.xml").read_text()  # brief: said only when true


def test_cancelled_tasks_count_as_errors(pytester: pytest.Pytester, trace: Path) -> None:
    write_config(pytester, [tracing_request("r", trace, n=3, sleep={"run": 60})], timeout_seconds=1)
    result = pytester.runpytest("--agentcompass=agentcompass.yaml")
    result.assert_outcomes(errors=3)
    result.stdout.fnmatch_lines(["r: 3 tasks, 0 passed, 0 failed, 3 errors"])
    (run_dir,) = run_dirs(pytester)
    info = json.loads((run_dir / "run_info.json").read_text())
    assert info["status"] == "timeout" and info["counts"]["errors"] == 3
    assert sorted(info["unfinished_tasks"]) == ["t0", "t1", "t2"]


#: Tasks whose metadata hold sets of strings: a set iterates in an order each process's hash seed decides.
SET_METADATA = """
import dataclasses
from pytest_agentcompass import HarnessFreeBenchmark, RunResult, TaskSpec


class Tagged(HarnessFreeBenchmark):
    evaluation_environment_mode = "none"

    def load_tasks(self, req):
        tags = {"alpha", "beta", "gamma", "delta", "epsilon", "zeta"}
        return [TaskSpec(f"t{i}", metadata={"tags": tags, "kinds": frozenset({"x", "y", "z"})}) for i in range(4)]

    async def run_task(self, task, prepared, env, req, plan):
        return RunResult(task.task_id, output="ok")

    async def evaluate(self, task, prepared, result, req, plan, env=None):
        return dataclasses.replace(result, score=0.0 if task.task_id == "t1" else 1.0)
"""


def test_a_resume_in_another_process_knows_tasks_whose_metadata_hold_sets(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A task's fingerprint must not depend on the process: the resume (another hash seed) finds the
    # two recorded tasks its own, and runs only the other two.
    pytester.makepyfile(tagged=SET_METADATA)
    write_config(
        pytester,
        [{"name": "r", "benchmark": {"id": "tagged.py:Tagged"}, "execution": {"retry_backoff_seconds": 0}}],
        task_concurrency=1,
    )
    monkeypatch.setenv("PYTHONHASHSEED", "1")
    pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-x").assert_outcomes(passed=1, failed=1)
    (run_dir,) = run_dirs(pytester)
    monkeypatch.setenv("PYTHONHASHSEED", "2")
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml")
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines([f"agentcompass: r: resuming {run_dir} (2 of 4 tasks done)"])
    result.stdout.fnmatch_lines(["r: 4 tasks, 3 passed, 1 failed, 0 errors, 2 resumed"])
