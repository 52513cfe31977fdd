"""``execution.details_layout: journal``: every task's detail as one line of ``details/journal.jsonl``.

The journal is read by every reader the detail files are (resume, carry-over,
the xdist controller, the aggregate, the page, baselines, the ``report`` and
``compare`` commands), written by several processes at once, and cut short by
kills and full disks: each case ends as it does with detail files.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pytest_agentcompass.runtime.store import RunStore, copy_details
from pytest_agentcompass.runtime.store import journal as journal_module
from pytest_agentcompass.runtime.store.details import JOURNAL, DetailFiles, layout_on_disk, read_detail_file
from pytest_agentcompass.runtime.store.journal import Journal

from conftest import write_config


def _journal_store(run_dir: Path) -> RunStore:
    return RunStore(run_dir, details_layout="journal")


def test_a_journal_run_makes_one_file_and_a_task_last_line_wins(tmp_path: Path) -> None:
    store = _journal_store(tmp_path)
    for task_id in ("b", "a", "c"):
        place = store.save_partial_result(task_id, {"task_id": task_id, "score": 0.0, "output": "x\ny"})
        assert place == f"{tmp_path}/details/{JOURNAL}#{task_id}"
    store.save_partial_result("a", {"task_id": "a", "score": 1.0})  # a rerun's record
    assert os.listdir(tmp_path / "details") == [JOURNAL]
    assert len((tmp_path / "details" / JOURNAL).read_text().splitlines()) == 4

    reader = DetailFiles(tmp_path)  # a reader names no layout: it finds the journal
    assert reader.layout == "journal" and layout_on_disk(tmp_path) == "journal"
    assert reader.detail_ids() == ["a", "b", "c"]
    assert reader.read_detail("a") == {"task_id": "a", "score": 1.0}
    assert reader.read_detail("b") == {"task_id": "b", "score": 0.0, "output": "x\ny"}
    assert read_detail_file(f"{tmp_path}/details/{JOURNAL}#a") == {"task_id": "a", "score": 1.0}
    assert read_detail_file(f"{tmp_path}/details/{JOURNAL}#z") is None
    assert reader.has_detail("c") and not reader.has_detail("z")
    assert reader.place("a") == f"details/{JOURNAL}"


def test_lines_that_are_no_record_read_as_tasks_not_done(tmp_path: Path) -> None:
    store = _journal_store(tmp_path)
    for task_id in ("a", "b", "c", "d"):
        store.save_partial_result(task_id, {"task_id": task_id, "score": 1.0})
    journal = tmp_path / "details" / JOURNAL
    with journal.open("a") as fh:
        fh.write('{"task_id":"b","status":"passed-honest"}\n')  # a status no result has
        fh.write("[1, 2]\n\n")  # JSON, but no record; an empty line
        fh.write('{"score": 1.0, "task_id": "c", "status": "completed"}\n')  # by hand: decoded whole
        fh.write('{"task_id":"d","score":1.0,"out')  # cut short by a kill
    reader = DetailFiles(tmp_path)
    assert reader.detail_ids() == ["a", "b", "c", "d"]
    assert [d["task_id"] for d in reader.iter_details()] == ["a", "c"], "b forged, d cut short: not done"
    assert reader.read_detail("c") == {"score": 1.0, "task_id": "c", "status": "completed"}

    # The next writer ends the cut line first: its own line stands alone, and d reads as done again.
    _journal_store(tmp_path).save_partial_result("d", {"task_id": "d", "score": 0.5})
    assert DetailFiles(tmp_path).read_detail("d") == {"task_id": "d", "score": 0.5}


def test_a_reader_sees_what_was_appended_since_it_last_looked(tmp_path: Path) -> None:
    writer = _journal_store(tmp_path)
    writer.save_partial_result("a", {"task_id": "a"})
    journal = Journal(str(tmp_path / "details" / JOURNAL))  # its own index, as another process has
    assert journal.task_ids() == ["a"]
    writer.save_partial_result("b", {"task_id": "b"})
    with open(journal.path, "a") as fh:
        fh.write('{"task_id":"c"')  # still being written: c is not done until its line ends
    assert journal.task_ids() == ["a", "b", "c"] and DetailFiles(tmp_path).read_detail("c") is None
    with open(journal.path, "a") as fh:
        fh.write("}\n")
    assert journal.task_ids() == ["a", "b", "c"] and journal.text("c") == b'{"task_id":"c"}'
    os.unlink(journal.path)  # another run at the same path starts over
    with open(journal.path, "w") as fh:
        fh.write('{"task_id":"z"}\n')
    assert journal.task_ids() == ["z"] and journal.text("a") is None


WRITER = """
import sys
from pathlib import Path
from pytest_agentcompass.runtime.store import RunStore
store = RunStore(Path(sys.argv[1]), details_layout="journal")
name, n = sys.argv[2], int(sys.argv[3])
for i in range(n):
    store.save_partial_result(f"{name}{i}", {"task_id": f"{name}{i}", "output": name * (i % 5000)})
"""


def test_two_processes_appending_at_once_leave_every_record_whole(tmp_path: Path) -> None:
    # What two xdist workers do: each record is one write on an O_APPEND descriptor.
    n = 1500
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), name, str(n)]) for name in ("p", "q")]
    assert [proc.wait(timeout=120) for proc in procs] == [0, 0]
    reader = DetailFiles(tmp_path)
    details = list(reader.iter_details())
    assert len(details) == 2 * n
    assert all(d["output"] == d["task_id"][0] * (int(d["task_id"][1:]) % 5000) for d in details)


FULL_DISK = """
import resource, signal, sys
from pathlib import Path
from pytest_agentcompass.runtime.store import RunStore
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead of killing
store = RunStore(Path(sys.argv[1]), details_layout="journal")
for task_id in ("a", "b"):
    store.save_partial_result(task_id, {"task_id": task_id, "score": 1.0})
size = (Path(sys.argv[1]) / "details" / "journal.jsonl").stat().st_size
resource.setrlimit(resource.RLIMIT_FSIZE, (size + int(sys.argv[2]), resource.RLIM_INFINITY))
for task_id in ("a", "b"):  # reruns' records
    try:
        store.save_partial_result(task_id, {"task_id": task_id, "score": 0.0, "output": "x" * 1000})
    except OSError as exc:
        print("refused:", exc)
"""


@pytest.mark.parametrize("room", [0, 100], ids=["nothing-written", "cut-short"])
def test_a_rerun_the_disk_refuses_reads_as_a_task_not_done(tmp_path: Path, room: int) -> None:
    # As with a detail file: a rerun whose record could not be written leaves the task not done,
    # never the earlier record standing for the rerun, whether the disk took nothing or a part.
    done = subprocess.run([sys.executable, "-c", FULL_DISK, str(tmp_path), str(room)], capture_output=True, text=True)
    assert done.stdout.count("refused:") == 2, done.stdout + done.stderr
    reader = DetailFiles(tmp_path)
    assert reader.detail_ids() == ["a", "b"]
    assert [reader.read_detail(t) for t in "ab"] == [None, None]
    assert not reader.has_detail("a") and not reader.has_detail("b"), "the Ctrl-C report must not count them"
    _journal_store(tmp_path).save_partial_result("c", {"task_id": "c"})
    assert [d["task_id"] for d in DetailFiles(tmp_path).iter_details()] == ["c"], "the cut line was ended"


KILLED_WRITER = """
import sys
from pytest_agentcompass.runtime.store import journal as journal_module
from pytest_agentcompass.runtime.store.journal import Journal
text = '{"task_id":"big","output":"' + "x" * (64 * 2**20) + '"}'
print("go", flush=True)
Journal(sys.argv[1]).append("big", text)
"""

STEADY_WRITER = """
import os, sys
from pathlib import Path
from pytest_agentcompass.runtime.store import RunStore
store, i = RunStore(Path(sys.argv[1]), details_layout="journal"), 0
while not os.path.exists(sys.argv[2]) or i < 50:
    store.save_partial_result(f"b{i}", {"task_id": f"b{i}", "score": 1.0})
    i += 1
print(i)
"""


def test_a_writer_killed_mid_line_costs_no_other_process_its_records(tmp_path: Path) -> None:
    # One xdist worker killed while it appends a large record, while the other appends all along:
    # not one of the other's records is lost (each waits for the journal's lock, then ends the cut line).
    path = str(tmp_path / "details" / JOURNAL)
    stop = tmp_path / "stop"
    _journal_store(tmp_path).save_partial_result("first", {"task_id": "first"})
    steady = subprocess.Popen([sys.executable, "-c", STEADY_WRITER, str(tmp_path), str(stop)], stdout=subprocess.PIPE)
    try:
        for _ in range(5):
            killed = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, path], stdout=subprocess.PIPE, text=True)
            assert killed.stdout is not None and killed.stdout.readline() == "go\n"
            start = os.path.getsize(path)
            while os.path.getsize(path) < start + 2**20 and killed.poll() is None:
                pass
            killed.kill()
            killed.wait()
            killed.stdout.close()
    finally:
        stop.touch()
        out, _ = steady.communicate(timeout=60)
    appended = int(out)
    reader = DetailFiles(tmp_path)
    steady_records = sorted(["first", *(f"b{i}" for i in range(appended))])
    # "big" is not done, unless this busy machine let a write of 64 MB end before the kill came.
    assert sorted(d["task_id"] for d in reader.iter_details() if d["task_id"] != "big") == steady_records


@pytest.mark.parametrize("size", ["same", "larger"])
def test_a_reader_of_a_run_made_again_at_the_same_path_reads_the_new_one(tmp_path: Path, size: str) -> None:
    # ext4 hands the freed inode out again, so neither the path nor the inode tells the new journal
    # from the old; a reader that kept its index reads the new one, and a refused write there
    # makes no other task's record unreadable.
    run = tmp_path / "run"
    for task_id in ("a", "b"):
        _journal_store(run).save_partial_result(task_id, {"task_id": task_id, "v": 1})
    reader = DetailFiles(run)
    assert reader.detail_ids() == ["a", "b"]
    shutil.rmtree(run)
    again = _journal_store(run)
    names = ("c", "d") if size == "same" else ("c", "d", "e")
    for task_id in names:
        again.save_partial_result(task_id, {"task_id": task_id, "v": 2})
    assert reader.detail_ids() == list(names)
    assert reader.read_detail("a") is None and reader.read_detail("c") == {"task_id": "c", "v": 2}
    assert not reader.has_detail("b") and reader.has_detail("d")


def test_a_run_keeps_the_layout_it_began_with(tmp_path: Path) -> None:
    files, journal = tmp_path / "files", tmp_path / "journal"
    RunStore(files).save_partial_result("a", {"task_id": "a"})
    _journal_store(journal).save_partial_result("a", {"task_id": "a"})
    _journal_store(files).save_partial_result("b", {"task_id": "b"})  # resumed with the journal asked for
    RunStore(journal).save_partial_result("b", {"task_id": "b"})  # resumed with files asked for
    assert sorted(os.listdir(files / "details")) == ["a.json", "b.json"]
    assert os.listdir(journal / "details") == [JOURNAL]
    assert DetailFiles(files).detail_ids() == DetailFiles(journal).detail_ids() == ["a", "b"]


def test_carry_over_copies_between_layouts_byte_for_byte(tmp_path: Path) -> None:
    files, journal, again = tmp_path / "files", tmp_path / "journal", tmp_path / "again"
    source = RunStore(files)
    for task_id, score in (("a", 1.0), ("b", 0.0)):
        source.save_partial_result(task_id, {"task_id": task_id, "score": score, "output": "snow ☃"})
    by_hand = {"score": 1.0, "task_id": "c", "note": "snow ☃"}  # made readable, keys reordered
    (files / "details" / "c.json").write_text(json.dumps(by_hand, indent=2, ensure_ascii=False))
    into_journal = _journal_store(journal)
    assert copy_details(files, into_journal, wanted=lambda _: True, keep=lambda _, d: d["score"] == 1.0) == (2, 1)
    assert into_journal.detail_ids() == ["a", "c"] and into_journal.same_detail(source, "a")
    assert into_journal.read_detail("c") == by_hand
    assert (journal / "details" / JOURNAL).read_text().splitlines()[-1].startswith('{"task_id":"c",')
    assert into_journal.same_detail(source, "c"), "made one line for the journal: the same record"
    into_files = RunStore(again)
    assert copy_details(journal, into_files, wanted=lambda _: True, keep=lambda _, d: True) == (2, 0)
    assert (again / "details" / "a.json").read_bytes() == (files / "details" / "a.json").read_bytes()
    assert into_files.same_detail(into_journal, "a") and not into_files.same_detail(into_journal, "b")


BENCH = """
import dataclasses
from pytest_agentcompass import HarnessFreeBenchmark, RunResult, TaskSpec
class B(HarnessFreeBenchmark):
    def load_tasks(self, req):
        return [TaskSpec(f"t{i}") for i in range(6)]
    async def run_task(self, task, prepared, env, req, plan):
        return RunResult(task.task_id, output="out-" + task.task_id)
    async def evaluate(self, task, prepared, result, req, plan, env=None):
        return dataclasses.replace(result, score=0.0 if task.task_id == "t4" else 1.0)
    def aggregate_metrics(self, results, req):  # not the default: results are read back one by one
        return {"outputs": [r.output for r in results]}
"""


def _request(layout: str) -> dict[str, object]:
    return {"name": "r", "benchmark": {"id": "bench.py:B"}, "execution": {"details_layout": layout}}


def test_a_journal_run_under_xdist_then_carried_over_into_files(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(bench=BENCH)
    write_config(pytester, [_request("journal")], task_concurrency=4)
    first = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-n", "2", "--junitxml=j.xml", "-v")
    first.assert_outcomes(passed=5, failed=1)
    (run_dir,) = (pytester.path / "runs" / "r").iterdir()
    assert os.listdir(run_dir / "details") == [JOURNAL]
    lines = (run_dir / "details" / JOURNAL).read_text().splitlines()
    assert sorted(json.loads(line)["task_id"] for line in lines) == [f"t{i}" for i in range(6)]
    first.stdout.fnmatch_lines([f"*detail: {run_dir}/details/{JOURNAL}#t4"])
    assert f'name="agentcompass.detail" value="{run_dir}/details/{JOURNAL}#t0"' in (pytester.path / "j.xml").read_text()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["metrics"]["outputs"] == [f"out-t{i}" for i in range(6)]
    page = (run_dir / "report.html").read_text()
    assert f'"detail":"details/{JOURNAL}"' in page and "out-t4" in page

    # The report and compare commands read a journal run as they read a run of files.
    report = subprocess.run(
        [sys.executable, "-m", "pytest_agentcompass", "report", str(run_dir), "-o", "again.html"],
        cwd=pytester.path,
        capture_output=True,
        text=True,
    )
    assert report.returncode == 0, report.stderr
    assert "out-t4" in (pytester.path / "again.html").read_text()

    # Carried over into a run that writes files (the config changed): t4 failed, so it runs again.
    write_config(pytester, [_request("files")], task_concurrency=4)
    second = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "--agentcompass-carry-over=latest")
    second.assert_outcomes(passed=5, failed=1)
    second.stdout.fnmatch_lines(["r: 6 tasks, 5 passed, 1 failed, 0 errors, 6 carried over"])
    (later,) = (d for d in (pytester.path / "runs" / "r").iterdir() if d != run_dir)
    assert sorted(os.listdir(later / "details")) == [f"t{i}.json" for i in range(6)]
    compare = subprocess.run(
        [sys.executable, "-m", "pytest_agentcompass", "compare", str(run_dir), str(later)],
        cwd=pytester.path,
        capture_output=True,
        text=True,
    )
    assert compare.returncode == 0, compare.stdout + compare.stderr


def test_a_journal_run_as_baseline_of_the_next(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(bench=BENCH)
    write_config(pytester, [_request("journal")])
    pytester.runpytest("--agentcompass=agentcompass.yaml").assert_outcomes(passed=5, failed=1)
    (run_dir,) = (pytester.path / "runs" / "r").iterdir()
    result = pytester.runpytest("--agentcompass=agentcompass.yaml", f"--agentcompass-baseline={run_dir}")
    result.assert_outcomes(passed=5, xfailed=1)  # t4 failed in the baseline too: a known failure


def test_a_killed_journal_run_resumes_and_keeps_what_it_recorded(pytester: pytest.Pytester) -> None:
    # A resumed journal run appends to the journal the killed process left: the details of tasks
    # the kill cut short are rewritten, the others are kept.
    pytester.makepyfile(
        bench=textwrap.dedent(BENCH).replace(
            "async def run_task(self, task, prepared, env, req, plan):",
            "async def run_task(self, task, prepared, env, req, plan):\n"
            "        import os\n"
            "        if task.task_id == 't5' and os.path.exists('stop'):\n"
            "            os.kill(os.getpid(), 9)",
        )
    )
    write_config(pytester, [_request("journal")], task_concurrency=1)
    (pytester.path / "stop").touch()
    killed = subprocess.run(
        [sys.executable, "-m", "pytest", "--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider", "-q"],
        cwd=pytester.path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert killed.returncode == -9
    (run_dir,) = (pytester.path / "runs" / "r").iterdir()
    journal = run_dir / "details" / JOURNAL
    assert DetailFiles(run_dir).detail_ids() == [f"t{i}" for i in range(5)]
    with journal.open("a") as fh:
        fh.write('{"task_id":"t2","request":"r","sco')  # a rerun of t2 the kill cut short: t2 is not done
    (pytester.path / "stop").unlink()
    write_config(pytester, [_request("files")], task_concurrency=1)  # asked for now; the run keeps its own
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml")
    result.assert_outcomes(passed=5, failed=1)
    result.stdout.fnmatch_lines(
        [
            "r: 6 tasks, 5 passed, 1 failed, 0 errors, 4 resumed",
            "*execution.details_layout: this run keeps its details as journal, the layout it began with; "
            "files applies to the next new run",
        ]
    )
    # At the run's end the journal holds one whole record per task: what the kill cut short is gone.
    lines = journal.read_text().splitlines()
    assert sorted(json.loads(line)["task_id"] for line in lines) == [f"t{i}" for i in range(6)]
    assert os.listdir(run_dir / "details") == [JOURNAL]


def test_compacting_a_journal_changes_nothing_a_reader_finds(tmp_path: Path) -> None:
    store = _journal_store(tmp_path)
    for task_id in ("a", "b", "c", "d", "e"):
        store.save_partial_result(task_id, {"task_id": task_id, "score": 0.0})
    store.save_partial_result("b", {"task_id": "b", "score": 1.0})  # a rerun: supersedes b's first line
    journal = tmp_path / "details" / JOURNAL
    with journal.open("a") as fh:
        fh.write("garbage\n\n")
        fh.write('{"task_id":"c","status":"forged"}\n')  # whole, but no record: c is not done
        fh.write('{"task_id":"d","sco')  # cut short: d is not done
    store.save_partial_result("e", {"task_id": "e", "score": 0.5})  # ends the cut line first
    with journal.open("a") as fh:
        fh.write('{"task_id":"a","sco')  # a rerun of a, cut short at the very end: a is not done

    def seen() -> dict[str, object]:
        reader = DetailFiles(tmp_path)
        return {task_id: reader.read_detail(task_id) for task_id in "abcdez"}

    before = seen()
    assert [t for t, d in before.items() if d is not None] == ["b", "e"]
    assert DetailFiles(tmp_path).compact_details()
    assert seen() == before
    lines = journal.read_text().splitlines()
    assert [line[:16] for line in lines] == ['{"task_id":"b","', '{"task_id":"c","', '{"task_id":"e","']
    inode = journal.stat().st_ino
    assert not DetailFiles(tmp_path).compact_details(), "one whole line per task: left as it is"
    assert journal.stat().st_ino == inode
    assert not RunStore(tmp_path / "files").compact_details(), "detail files are left as they are"


def test_a_journal_read_in_small_chunks_reads_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The index reads a chunk at a time (memory must not grow with the journal): lines that
    # straddle chunks, and lines longer than a chunk, are read whole.
    store = _journal_store(tmp_path)
    for i in range(200):
        store.save_partial_result(f"t{i}", {"task_id": f"t{i}", "output": "x" * (i * 7 % 300)})
    expected = {d["task_id"]: d for d in DetailFiles(tmp_path).iter_details()}
    monkeypatch.setattr(journal_module, "_CHUNK", 64)
    reader = DetailFiles(tmp_path)
    assert {d["task_id"]: d for d in reader.iter_details()} == expected and len(expected) == 200
    store.save_partial_result("t3", {"task_id": "t3", "output": "again"})
    assert reader.read_detail("t3") == {"task_id": "t3", "output": "again"}


def test_a_journal_compacted_while_another_process_appends_loses_nothing(tmp_path: Path) -> None:
    # A worker that outlived its run's end appends while the owner compacts: its record goes into
    # the journal that is in place once it holds the lock, never into the one replaced.
    stop = tmp_path / "stop"
    _journal_store(tmp_path).save_partial_result("first", {"task_id": "first"})
    steady = subprocess.Popen([sys.executable, "-c", STEADY_WRITER, str(tmp_path), str(stop)], stdout=subprocess.PIPE)
    try:
        owner = DetailFiles(tmp_path)
        while len(owner.detail_ids()) < 100 and steady.poll() is None:  # the writer is under way
            time.sleep(0.01)
        compacted = 0
        while compacted < 200 and steady.poll() is None:
            with (tmp_path / "details" / JOURNAL).open("a") as fh:
                fh.write("\n")  # an empty line: something to compact away each time
            compacted += owner.compact_details()
    finally:
        stop.touch()
        out, _ = steady.communicate(timeout=60)
    assert compacted == 200
    reader = DetailFiles(tmp_path)
    assert sorted(d["task_id"] for d in reader.iter_details()) == sorted(["first", *(f"b{i}" for i in range(int(out)))])
    assert [p for p in os.listdir(tmp_path / "details") if p != JOURNAL] == [], "no temporary file left"
