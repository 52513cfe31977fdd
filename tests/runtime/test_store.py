"""The run directory writer: atomic files, plans folded into run_info, a disk that refuses."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from pytest_agentcompass import ExecutionPlan, RunResult, TaskSpec
from pytest_agentcompass.runtime.store import RunStore, copy_details, iter_runs, read_run_info_head
from pytest_agentcompass.runtime.store import details as details_module
from pytest_agentcompass.runtime.summary import StoredResults
from pytest_agentcompass.runtime.task import TaskOutcome


def _plan(task_id: str, attempt: int, mode: str = "none") -> ExecutionPlan:
    return ExecutionPlan(task_id=task_id, attempt_index=attempt, evaluation_environment_mode=mode)


def test_run_info_folds_the_last_plan_of_each_attempt_in_task_order(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    awkward = 'quote " back \\ snow ☃'
    store.record_plan(_plan("b", 0))
    store.record_plan(_plan(awkward, 0))
    store.record_plan(_plan("b", 1))
    store.record_plan(_plan("b", 0, mode="fresh"))  # a retry planned again: the later plan wins
    store.close()
    store.write_run_info({"status": "completed"}, with_plans=True)

    info = json.loads((tmp_path / "run_info.json").read_text())
    plans = info["resolved_execution_plans"]
    assert list(plans) == ["b", awkward]
    assert plans["b"]["0"]["evaluation_environment_mode"] == "fresh"
    assert plans["b"]["1"]["attempt_index"] == 1
    assert plans[awkward]["0"]["task_id"] == awkward
    assert info["status"] == "completed"


def test_a_plan_line_cut_by_a_kill_is_skipped_and_the_log_stays_appendable(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    store.record_plan(_plan("t0", 0))
    store.close()
    with (tmp_path / "plans.jsonl").open("a") as fh:
        fh.write('{"task_id": "t1", "attempt_index": 0, "evalua')  # what SIGKILL mid-write leaves

    resumed = RunStore(tmp_path)
    resumed.record_plan(_plan("t2", 0))
    resumed.close()
    resumed.write_run_info({"status": "completed"}, with_plans=True)

    plans = json.loads((tmp_path / "run_info.json").read_text())["resolved_execution_plans"]
    assert list(plans) == ["t0", "t2"]


def test_run_info_without_plans_and_reading_it_back(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    store.write_run_info({"status": "running"}, with_plans=True)
    assert json.loads((tmp_path / "run_info.json").read_text()) == {
        "status": "running",
        "resolved_execution_plans": {},
    }
    store.record_plan(_plan("t0", 0))
    info = store.update_run_info(status="completed", with_plans=True)
    assert "resolved_execution_plans" not in info, "plans are streamed from plans.jsonl, never held"
    assert store.read_run_info() == {"status": "completed"}
    store.close()


def test_listing_runs_reads_run_info_up_to_its_plans(tmp_path: Path) -> None:
    """Choosing a run to resume or reuse must not parse every earlier run's megabytes of plans."""
    big = {"status": "completed", "started_at": "2026-01-01T00:00:00", "config": {"notes": "x" * 200_000}}
    runs = tmp_path / "request"
    for name, info in (("r1", big), ("r2", {**big, "started_at": "2026-01-02T00:00:00", "status": "running"})):
        store = RunStore(runs / name)
        for i in range(3):
            store.record_plan(_plan(f"t{i}", 0))
        store.close()
        store.write_run_info(info, with_plans=True)  # the marker lands past the first 64 KiB read
    full = json.loads((runs / "r1" / "run_info.json").read_text())
    assert len(full.pop("resolved_execution_plans")) == 3
    assert read_run_info_head(runs / "r1" / "run_info.json") == full
    # Proof that the plans are not parsed: spoil them, and the run is still listed and read.
    path = runs / "r1" / "run_info.json"
    text = path.read_text()
    path.write_text(text[: text.index('"resolved_execution_plans"')] + '"resolved_execution_plans": {not json')
    assert [p.name for p, _ in iter_runs(runs)] == ["r2", "r1"]
    assert RunStore(runs / "r1").read_run_info() == full
    # An older layout with keys after the plans: read whole, nothing lost.
    older = runs / "r0" / "run_info.json"
    older.parent.mkdir()
    older.write_text(
        '{\n  "status": "interrupted",\n  "resolved_execution_plans": {\n    "t0": {"0": {}}\n  },\n'
        '  "stop_reason": "killed",\n  "unfinished_tasks": ["t1"]\n}\n'
    )
    assert read_run_info_head(older) == {
        "status": "interrupted",
        "resolved_execution_plans": {"t0": {"0": {}}},
        "stop_reason": "killed",
        "unfinished_tasks": ["t1"],
    }
    # A run_info written without plans is read whole.
    (runs / "r3").mkdir()
    (runs / "r3" / "run_info.json").write_text('{"status": "created", "started_at": "2026-01-03T00:00:00"}')
    assert [p.name for p, _ in iter_runs(runs)] == ["r3", "r2", "r1", "r0"]


def test_a_plan_recorded_after_the_run_closed_its_store_is_dropped(tmp_path: Path) -> None:
    """An attempt that outlived its run (past the cleanup grace) must not reopen plans.jsonl and leak it."""
    store = RunStore(tmp_path)
    store.record_plan(_plan("t0", 0))
    store.close()
    before = (tmp_path / "plans.jsonl").read_text()
    store.record_plan(_plan("t0", 0), placement={"task": "unix:///late.sock"})
    assert (tmp_path / "plans.jsonl").read_text() == before
    assert not [
        fd for fd in os.listdir("/proc/self/fd") if os.path.realpath(f"/proc/self/fd/{fd}").endswith("plans.jsonl")
    ]


def test_details_are_whole_files_with_no_temporary_left(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    for i in range(50):
        store.save_partial_result(f"t{i}", {"task_id": f"t{i}", "output": "x" * 100_000})
    store.close()
    files = sorted(p.name for p in (tmp_path / "details").iterdir())
    assert files == sorted(f"t{i}.json" for i in range(50))
    assert json.loads((tmp_path / "details" / "t7.json").read_text())["output"] == "x" * 100_000


def test_the_details_a_run_holds_as_every_reader_sees_them(tmp_path: Path) -> None:
    # The store is the one place that knows where a detail lives: resume, carry-over, the page,
    # baselines and gates ask it, and take a detail a kill cut short for a task not done.
    store = RunStore(tmp_path / "run")
    assert not details_module.holds_details(store.run_dir) and store.detail_ids() == []
    for task_id in ("b", "a", "c"):
        store.save_partial_result(task_id, {"task_id": task_id, "score": 1.0})
    details = store.run_dir / "details"
    (details / "d.json").write_text('{"task_id": "d"')  # cut short by a kill
    (details / "e.json").write_text("[1, 2]")  # JSON, but no record
    (details / "g.json").write_text('{"task_id": "g", "status": "passed-honest"}')  # a status no result has
    (details / "h.json").write_text('{"task_id": ["h"]}')  # no task id
    (details / ".f.json.123-ab-1.tmp").write_text("{}")  # a killed writer's temporary name
    assert details_module.holds_details(store.run_dir)
    assert store.detail_ids() == ["a", "b", "c", "d", "e", "g", "h"]
    assert store.read_detail("a") == {"task_id": "a", "score": 1.0}
    assert [task_id for task_id in "deghz" if store.read_detail(task_id) is not None] == []
    assert store.has_detail("a") and not store.has_detail("d") and not store.has_detail("z"), "cut short: none"
    assert [d["task_id"] for d in store.iter_details()] == ["a", "b", "c"]


def test_results_read_back_for_the_aggregate_fall_back_to_memory_for_a_detail_that_is_no_result(
    tmp_path: Path,
) -> None:
    # The aggregate reads each task's result back from its detail, one at a time. A detail
    # replaced since it was written (a list, a record of another shape, a file gone) must not
    # end the request with a traceback: the result the run holds in memory counts instead.
    store = RunStore(tmp_path)
    outcomes = []
    for task_id in ("ok", "list", "shape", "gone"):
        path = store.save_partial_result(task_id, {"task_id": task_id, "score": 1.0, "output": "on disk"})
        result = RunResult(task_id, output="in memory", score=0.5)
        outcomes.append(TaskOutcome(request="r", task=TaskSpec(task_id), result=result, passed=True, detail_path=path))
    (tmp_path / "details" / "list.json").write_text("[1, 2]")
    (tmp_path / "details" / "shape.json").write_text('{"output": "no task id"}')
    (tmp_path / "details" / "gone.json").unlink()
    results = StoredResults(outcomes)
    assert [(r.task_id, r.output, r.score) for r in results] == [
        ("ok", "on disk", 1.0),
        ("list", "in memory", 0.5),
        ("shape", "in memory", 0.5),
        ("gone", "in memory", 0.5),
    ]


def test_carried_over_details_are_copied_byte_for_byte_and_told_apart(tmp_path: Path) -> None:
    source = RunStore(tmp_path / "source")
    for task_id, score in (("a", 1.0), ("b", 0.0), ("c", 1.0)):
        source.save_partial_result(task_id, {"task_id": task_id, "score": score})
    (source.run_dir / "details" / "d.json").write_text('{"task_id": "d"')  # cut short: skipped, counted
    run = RunStore(tmp_path / "run")
    copied, skipped = copy_details(
        source.run_dir, run, wanted=lambda task_id: task_id != "c", keep=lambda _, d: d["score"] == 1.0
    )
    assert (copied, skipped) == (1, 2), "a copied; b refused by keep; c not wanted; d unreadable"
    assert run.detail_ids() == ["a"]
    assert (run.run_dir / "details" / "a.json").read_bytes() == (source.run_dir / "details" / "a.json").read_bytes()
    assert run.same_detail(source, "a")
    run.save_partial_result("b", {"task_id": "b", "score": 1.0})  # made by this run, not copied
    assert not run.same_detail(source, "b") and not run.same_detail(source, "z")


def test_details_another_process_sent_are_taken_and_the_rest_read_from_disk(tmp_path: Path) -> None:
    # A worker's store keeps what it writes (its ``written``); the controller's takes that.
    controller = RunStore(tmp_path)
    assert list(controller.iter_details()) == []  # the run opened, empty: every detail is to come
    worker = RunStore(tmp_path)
    worker.written = []
    for task_id in ("a", "b"):
        worker.save_partial_result(task_id, {"task_id": task_id, "score": 1.0, "output": task_id * 3})
    RunStore(tmp_path).save_partial_result("c", {"task_id": "c", "score": 0.0})  # written, not sent
    (tmp_path / "details" / "d.json").write_text('{"task_id": "d"')  # cut short by a kill: not done
    assert [task_id for task_id, _, _ in worker.written] == ["a", "b"]

    (tmp_path / "details" / "a.json").write_text("not read")  # what was sent is not read back
    taken = list(controller.details_sent(worker.written, {"a", "b", "c", "d"}))
    assert [(d["task_id"], d["score"]) for d in taken] == [("a", 1.0), ("b", 1.0), ("c", 0.0)]
    records = controller.page_records()
    assert records is not None
    assert sorted(record["task_id"] for record in records) == ["a", "b", "c"], "the page has every task done"


def test_a_worker_keeps_what_it_wrote_up_to_a_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Past the budget nothing is sent: one xdist message carries at most 2 GiB, held twice while sent.
    monkeypatch.setattr(details_module, "KEEP_WRITTEN_CHARS", 500)
    worker = RunStore(tmp_path)
    worker.written = []
    worker.save_partial_result("a", {"task_id": "a", "output": "x" * 300})
    assert [task_id for task_id, _, _ in worker.written] == ["a"]
    worker.save_partial_result("b", {"task_id": "b", "output": "x" * 300})
    assert worker.written is None
    worker.save_partial_result("c", {"task_id": "c"})
    assert worker.written is None, "not kept again once over"


def test_the_page_shows_no_detail_removed_since_the_run_opened(tmp_path: Path) -> None:
    # A rerun whose new detail could not be written (a full disk) removes the old one: no row
    # for it may stay on the page, from either path the controller takes.
    for take in ("sent", "scan"):
        first = RunStore(tmp_path)
        for task_id in ("t0", "t1"):
            first.save_partial_result(task_id, {"task_id": task_id, "score": 1.0})
        controller = RunStore(tmp_path)
        assert len(list(controller.iter_details())) == 2  # the run (re)opens
        (tmp_path / "details" / "t1.json").unlink(missing_ok=True)
        if take == "sent":
            assert list(controller.details_sent([], {"t1"})) == []
        else:
            assert [d["task_id"] for d in controller.iter_details()] == ["t0"]
        records = controller.page_records()
        assert records is not None
        assert [record["task_id"] for record in records] == ["t0"], take


def test_a_refused_write_raises_and_leaves_no_temporary(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    store.save_partial_result("t0", {"task_id": "t0"})
    (tmp_path / "details" / "t1.json").mkdir()  # os.replace cannot put a file over a directory
    with pytest.raises(OSError):
        store.save_partial_result("t1", {"task_id": "t1"})
    assert sorted(p.name for p in (tmp_path / "details").iterdir()) == ["t0.json", "t1.json"]


DISK_FULL = """
import dataclasses, shutil
from pathlib import Path
from pytest_agentcompass import HarnessFreeBenchmark, RunResult, TaskSpec

class Blocked(HarnessFreeBenchmark):
    def load_tasks(self, req):
        return [TaskSpec("t0", ground_truth="a"), TaskSpec("t1", ground_truth="b")]
    async def run_task(self, task, prepared, env, req, plan):
        if task.task_id == "t1":
            # What a full or read-only disk looks like to the store: the details folder is gone.
            for details in Path("runs/blocked").glob("*/details"):
                shutil.rmtree(details)
                details.write_text("not a folder")
        return RunResult(task.task_id, output="a")
    def evaluate(self, task, prepared, result, req, plan, env=None):
        return dataclasses.replace(result, score=float(result.output == task.ground_truth))
"""


def test_a_detail_the_disk_refuses_is_a_teardown_error_and_the_result_stands(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(blocked=DISK_FULL)
    pytester.makefile(
        ".yaml",
        agentcompass="output_dir: runs\ntask_concurrency: 1\nrequests:\n"
        "  - name: blocked\n    benchmark: {id: 'blocked.py:Blocked'}\n    harness: {id: none}\n",
    )
    result = pytester.runpytest("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1, errors=1)  # t1: scored (call failed) + teardown error
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of*t1*",
            "*its detail record could not be written, so a resume runs it again:*",
        ]
    )
    summary = json.loads(next(pytester.path.glob("runs/blocked/*/summary.json")).read_text())
    assert [(t["task_id"], t["score"]) for t in summary["tasks"]] == [("t0", 1.0), ("t1", 0.0)]


def _claim(run_dir: str, barrier: Any, wins: Any) -> None:
    from pytest_agentcompass.runtime.store import claim_run_dir
    from pytest_agentcompass.vocabulary.errors import AgentCompassError

    barrier.wait()
    try:
        claim_run_dir(Path(run_dir), "r", "fp")
    except AgentCompassError:
        pass
    else:
        with wins.get_lock():
            wins.value += 1
    barrier.wait()  # every contender stays alive (a live holder) until all have tried


def test_only_one_process_claims_a_run(tmp_path: Path) -> None:
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    contenders = 6
    for round_ in range(5):
        run_dir = tmp_path / f"run-{round_}"
        run_dir.mkdir()
        barrier, wins = ctx.Barrier(contenders), ctx.Value("i", 0)
        procs = [ctx.Process(target=_claim, args=(str(run_dir), barrier, wins)) for _ in range(contenders)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(timeout=60)
        assert wins.value == 1, f"round {round_}: {wins.value} processes hold the same run"


def test_a_request_file_is_written_by_the_store_redacted_and_never_over_its_own_records(tmp_path: Path) -> None:
    """``RunFiles`` (a component's ``run_files``): lines are masked as they are written, even a secret
    that arrives in pieces; the store's own names are refused."""
    from pytest_agentcompass.vocabulary.redact import Redactor

    secret = "s3cr3t-value-of-the-run"
    files = RunStore(tmp_path, Redactor([secret])).component_files
    with files.open_text("images/build.log") as log:
        assert log.path == tmp_path / "images" / "build.log"
        log.write(f"step 1: {secret[:6]}")
        log.write(f"{secret[6:]} used\nstep 2")
        assert (tmp_path / "images" / "build.log").read_text() == "step 1: *** used\n"  # whole lines so far
        log.write(" done")
    assert (tmp_path / "images" / "build.log").read_text() == "step 1: *** used\nstep 2 done"
    assert files.save("notes/a.json", {"key": secret}) == "notes/a.json"
    assert secret not in (tmp_path / "notes" / "a.json").read_text()
    for name in ("details/x.json", "summary.json", "artifacts/t/a", "run_info.json", "../up", "/abs"):
        with pytest.raises(ValueError):
            files.save(name, "x")
    assert not (tmp_path / "details").exists() and not (tmp_path / "summary.json").exists()
