"""What the run's page costs in memory (issue 27): records held packed, the page written in pieces.

Measured with ``tracemalloc`` (allocations, not time): deterministic for the same inputs.
"""

from __future__ import annotations

import gc
import json
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from pytest_agentcompass.reports.html import page_chunks, render_page, write_run_report
from pytest_agentcompass.runtime.store import RunStore
from pytest_agentcompass.vocabulary import redact
from pytest_agentcompass.vocabulary.redact import Redactor

TASKS = 2000


def detail(i: int) -> dict[str, Any]:
    """A small task's detail, as the runtime writes one."""
    return {
        "task_id": f"t{i}",
        "request": "r",
        "status": "scored",
        "passed": True,
        "score": 1.0,
        "output": "ok",
        "error": None,
        "attempts": 1,
        "retries": 0,
        "duration": 0.0123,
        "metadata": {"attempt_scores": {"0": 1.0}},
        "attempt_results": {"0": {"task_id": f"t{i}", "score": 1.0, "status": "scored", "error": None}},
    }


def filled_store(run_dir: Path, tasks: int = TASKS) -> RunStore:
    store = RunStore(run_dir)
    for _ in store.iter_details():  # nothing on disk yet: every detail to come goes through this store
        pass
    for i in range(tasks):
        store.save_partial_result(f"t{i}", detail(i))
    store.write_summary({"request": "r", "tasks": [{"task_id": f"t{i}"} for i in range(tasks)]})
    return store


def test_the_store_keeps_what_the_page_shows_in_a_few_hundred_bytes_per_task(tmp_path: Path) -> None:
    ids = [f"t{i}" for i in range(TASKS)]  # made before measuring: the store's keys are these
    store = RunStore(tmp_path / "run")
    for _ in store.iter_details():
        pass
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i, task_id in enumerate(ids):
            store.save_partial_result(task_id, detail(i))
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # As dicts the records took about 900 bytes per task here; packed about 250.
    assert held / TASKS < 450, f"{held / TASKS:.0f} bytes per task"
    records = store.page_records()
    assert records is not None and len(records) == TASKS
    assert records.record("t7")["output"] == "ok" and records.record("t7")["attempt_results"]["0"]["score"] == 1.0


def test_the_page_is_written_in_pieces_none_of_them_the_whole_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A run without secrets. Runtime secrets are process-wide: one an earlier test of this worker
    # registered (an API key) would make the page be joined whole to be masked, as it must.
    monkeypatch.setattr(redact, "_runtime", frozenset())
    store = filled_store(tmp_path / "run", tasks=10_000)
    gc.collect()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        path = write_run_report(store)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    size = path.stat().st_size
    # Joined, escaped and encoded whole, the page was held several times over at once: 4.8 times
    # its size at the peak here; in pieces 2.7 (the rows, the summary's order, one piece of details).
    assert peak < 3.5 * size, f"peak {peak} bytes for a page of {size}"
    pieces = list(page_chunks([store.run_dir], None, link_base=store.run_dir, title="x", known=None))
    assert max(map(len, pieces)) < size / 4
    # The same page a single string gives (a page read back from the files, where every detail is too).
    again = render_page([store.run_dir], None, link_base=store.run_dir, title="x")
    data = json.loads(again.split('type="application/json">')[1].split("</script>")[0])
    written = path.read_text()
    assert json.loads(written.split('type="application/json">')[1].split("</script>")[0]) == data
    assert len(data["details"]) == 10_000 and data["rows"][5][1] == "t5"


def test_with_secrets_the_page_is_masked_whole(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "run", Redactor(["s3cret-value-42"]))
    for _ in store.iter_details():
        pass
    store.save_partial_result("t0", {**detail(0), "output": "said s3cret-value-42 aloud"})
    text = write_run_report(store).read_text()
    assert "s3cret-value-42" not in text and "said *** aloud" in text


def test_the_page_records_are_released_once_the_page_is_written(tmp_path: Path) -> None:
    store = filled_store(tmp_path / "run")
    write_run_report(store)
    store.forget_page_records()
    assert store.page_records() is None  # a page written later reads the files
    page = write_run_report(store).read_text()
    assert page.count('"detail":') == TASKS
