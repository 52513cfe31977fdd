"""The HTML report at scale: page size, render time, and first paint in headless chromium.

Writes a synthetic run directory of ``--n`` task details through the store
(outputs, errors with traces, retries, a conversation on some tasks), then:

- renders it with ``python -m pytest_agentcompass report`` as a child process
  (wall and CPU time; a 100-task run directory alongside for the ratio);
- opens both pages in one headless chromium over the DevTools protocol and
  reads, from the page itself, when the first rows were on screen (two
  animation frames after they were inserted), when every row was, and the
  load event.

    python perf/bench_report.py --n 10000 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from _common import describe_filesystem, measure

from pytest_agentcompass.runtime.store import RunStore

from browser import browser, file_url, find_chromium

TRACE = "".join(f'  File "bench.py", line {i}, in step_{i}\n    call_{i}(arg)\n' for i in range(20))


#: Runs in the page: first paint, then typing a filter, sorting and scrolling, each until painted.
PROBE = """
new Promise(function (done) {
  function painted(fn) { requestAnimationFrame(function () { requestAnimationFrame(fn); }); }
  function timed(action, next) {
    var t = performance.now(); action(); painted(function () { next(performance.now() - t); });
  }
  (function wait() {
    if (!window.agentcompassFirstPaint) return setTimeout(wait, 20);
    var out = {first_paint_ms: window.agentcompassFirstPaint,
               load_ms: performance.getEntriesByType("navigation")[0].loadEventEnd};
    var q = document.getElementById("f-q"), rows = function () { return document.querySelectorAll("tr.task").length; };
    out.rows_first = rows();
    timed(function () { q.value = "task-00"; q.dispatchEvent(new Event("input")); }, function (ms) {
      out.filter_ms = ms; out.rows_filtered = rows();
      timed(function () { q.value = ""; q.dispatchEvent(new Event("input"));
                          document.querySelector('th[data-col="score"]').click(); }, function (ms) {
        out.sort_ms = ms;
        timed(function () { window.scrollTo(0, document.body.scrollHeight); }, function (ms) {
          setTimeout(function () { out.scroll_ms = ms; out.rows_after_scroll = rows(); done(out); }, 100);
        });
      });
    });
  })();
})
"""


def write_run(run_dir: Path, n: int) -> None:
    store = RunStore(run_dir)
    tasks = []
    for i in range(n):
        task_id = f"task-{i:05d}"
        error = i % 20 == 0
        passed = not error and i % 5 != 0
        detail = {
            "task_id": task_id,
            "request": "bench",
            "category": f"cat-{i % 7}",
            "passed": passed,
            "output": f"answer {i}: " + "lorem ipsum dolor sit amet " * 10,
            "score": None if error else (1.0 if passed else (i % 10) / 10),
            "status": "inference_error" if error else "scored",
            "error": f"RuntimeError: tool call failed on step {i}" if error else None,
            "artifacts": {"answer.txt": f"answer {i}"},
            "metadata": {
                "usage": {"total_tokens": 1000 + i},
                **(
                    {
                        "trajectory": [{"role": "user", "content": "solve it"}, {"role": "assistant", "content": "ok"}]
                        * 5
                    }
                    if i % 10 == 0
                    else {}
                ),
            },
            "attempts": 1,
            "attempt_results": {"0": {"status": "scored", "score": 1.0 if passed else 0.0}},
            "retries": 1 if i % 25 == 0 else 0,
            "trace": TRACE if error else None,
            "notes": [],
            "duration": 0.5 + (i % 100) / 10,
        }
        store.save_partial_result(task_id, detail)
        if detail["retries"]:
            store.save_retry_detail(
                task_id, 0, 1, {"attempt_index": 0, "retry_number": 1, "stage": "inference", "error": "timeout"}
            )
        tasks.append({"task_id": task_id, "status": detail["status"], "score": detail["score"], "passed": passed})
    metrics = {"tasks": n, "passed": sum(t["passed"] for t in tasks), "pass@1": sum(t["passed"] for t in tasks) / n}
    store.write_summary(
        {"request": "bench", "run_id": run_dir.name, "status": "completed", "metrics": metrics, "tasks": tasks}
    )
    store.write_run_info(
        {"run_id": run_dir.name, "request": "bench", "status": "completed", "config": {"requests": []}}
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    # The children import this checkout, wherever the temporary folder is.
    repo = str(Path(__file__).resolve().parents[1])
    os.environ["PYTHONPATH"] = os.pathsep.join([repo, *filter(None, [os.environ.get("PYTHONPATH")])])
    chromium = find_chromium()
    if chromium is None:
        raise SystemExit("chromium is not installed (apt-get install -y chromium)")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        print(f"run directories on: {describe_filesystem(root)}")
        runs = {"small": root / "bench/small", "large": root / "bench/large"}
        write_run(runs["small"], 100)
        write_run(runs["large"], args.n)
        cmd = [sys.executable, "-m", "pytest_agentcompass", "report"]
        render: dict[str, list[tuple[float, float]]] = {"small": [], "large": []}
        pages: dict[str, list[dict[str, float]]] = {"small": [], "large": []}
        for _ in range(args.repeat):
            for name, run_dir in runs.items():
                m = measure([*cmd, str(run_dir)], root)
                if m.returncode != 0:
                    raise SystemExit(f"report failed: {m.tail}")
                render[name].append((m.seconds, m.cpu_seconds))
            with browser(chromium) as page:
                for name, run_dir in runs.items():
                    page.open(file_url(run_dir / "report.html"))
                    pages[name].append(page.evaluate(PROBE))
        size = (runs["large"] / "report.html").stat().st_size
        print(f"tasks: {args.n}; page: {size / 1e6:.2f} MB; repeats: {args.repeat}")
        for name in runs:
            wall = statistics.median(w for w, _ in render[name])
            cpu = statistics.median(c for _, c in render[name])
            print(f"render {name}: median wall {wall:.2f} s, cpu {cpu:.2f} s")
        for name in runs:
            for key in ("first_paint_ms", "load_ms", "filter_ms", "sort_ms", "scroll_ms"):
                values = [p[key] for p in pages[name]]
                each = ", ".join(f"{v:.0f}" for v in values)
                print(f"chromium {name}: {key} median {statistics.median(values):.0f} ({each})")
            last = pages[name][-1]
            print(
                f"chromium {name}: rows in the DOM: first {last['rows_first']}, filtered {last['rows_filtered']}, "
                f"after one scroll to the end {last['rows_after_scroll']}"
            )
        print(json.dumps({"render": render, "pages": pages}))


if __name__ == "__main__":
    main()
