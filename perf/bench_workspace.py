"""Workspaces in use: N tasks that each write one file into their ``local`` workspace, many at once.

Against the same run whose tasks write nothing (so their workspaces are never
created), alternated in one process tree, which side goes first alternating
too. Each child also reports how many threads it started (counted by a
``conftest.py`` around ``threading.Thread.start``) and the most alive at once.
Target: the writing side within 1.3x of the other, and no more threads.
Usage::

    python perf/bench_workspace.py --n 10000 --concurrency 500 --repeat 5
    python perf/bench_workspace.py --n 10000 --base-dir /dev/shm   # workspaces elsewhere
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from _common import Measurement, describe_filesystem, measure, pytest_cmd

SUITE = """
from pytest_agentcompass import HarnessFreeBenchmark, RunResult, TaskSpec

class Writers(HarnessFreeBenchmark):
    evaluation_environment_mode = "none"
    def __init__(self, n, write):
        super().__init__(n=n, write=write)
        self.n, self.write = n, write
    def load_tasks(self, req):
        return [TaskSpec(f"t{i}") for i in range(self.n)]
    async def run_task(self, task, prepared, env, req, plan):
        if self.write:
            await env.write_bytes("answer.txt", b"42\\n")
        return RunResult(task.task_id, output="ok")
    async def evaluate(self, task, prepared, result, req, plan, env=None):
        return result.__class__(task.task_id, output=result.output, score=1.0)
"""

# Counts threads in the child; both sides load it.
CONFTEST = """
import threading

_started = 0
_peak = 0
_start = threading.Thread.start

def _counting_start(self):
    global _started, _peak
    _started += 1
    _start(self)
    _peak = max(_peak, threading.active_count())

threading.Thread.start = _counting_start

def pytest_unconfigure(config):
    with open("threads.txt", "w") as out:
        out.write(f"{_started} {_peak}\\n")
"""


def config(n: int, concurrency: int, write: bool, base_dir: str | None) -> str:
    params = f"{{base_dir: '{base_dir}'}}" if base_dir else "{}"
    return (
        f"output_dir: runs\ntask_concurrency: {concurrency}\nrequests:\n"
        f"  - name: {'write' if write else 'none'}\n"
        f"    benchmark: {{id: 'suite.py:Writers', params: {{n: {n}, write: {str(write).lower()}}}}}\n"
        f"    environment: {{id: local, params: {params}}}\n"
    )


def run(root: Path, name: str) -> tuple[Measurement, int, int]:
    result = measure(pytest_cmd(f"--agentcompass={name}.yaml", "--agentcompass-progress=off"), root)
    if result.returncode != 0:
        raise SystemExit(f"{name} run failed (exit {result.returncode}): {result.tail}")
    started, peak = (int(v) for v in (root / "threads.txt").read_text().split())
    return result, started, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--base-dir", default=None, help="where workspaces go (default: the temp dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        workspaces = Path(args.base_dir or tempfile.gettempdir())
        print(f"run directory on: {describe_filesystem(root)}; workspaces on: {describe_filesystem(workspaces)}")
        (root / "suite.py").write_text(SUITE)
        (root / "conftest.py").write_text(CONFTEST)
        for write in (False, True):
            name = "write" if write else "none"
            (root / f"{name}.yaml").write_text(config(args.n, args.concurrency, write, args.base_dir))
        run(root, "none")  # unmeasured: writes the bytecode caches
        rows: list[tuple[tuple[Measurement, int, int], tuple[Measurement, int, int]]] = []
        for round_ in range(args.repeat):
            order = ("none", "write") if round_ % 2 == 0 else ("write", "none")
            got = {name: run(root, name) for name in order}
            none, write = got["none"], got["write"]
            rows.append((none, write))
            print(
                f"round {round_ + 1}: no file {none[0].seconds:6.2f}s wall {none[0].cpu_seconds:6.2f}s CPU"
                f" ({none[1]} threads started, {none[2]} at most);"
                f" one file {write[0].seconds:6.2f}s wall {write[0].cpu_seconds:6.2f}s CPU"
                f" ({write[1]} threads started, {write[2]} at most);"
                f" ratio {write[0].seconds / none[0].seconds:.2f}x wall,"
                f" {write[0].cpu_seconds / none[0].cpu_seconds:.2f}x CPU"
            )
        wall = [w[0].seconds / n[0].seconds for n, w in rows]
        cpu = [w[0].cpu_seconds / n[0].cpu_seconds for n, w in rows]
        print(
            f"median ratio (one file / no file): {statistics.median(wall):.2f}x wall, {statistics.median(cpu):.2f}x CPU"
        )
        for label, index in (("no file", 0), ("one file", 1)):
            side = [row[index] for row in rows]
            print(
                f"  {label:>8}: median {statistics.median(s[0].seconds for s in side):.2f}s wall,"
                f" {statistics.median(s[0].cpu_seconds for s in side):.2f}s CPU,"
                f" peak RSS {statistics.median(s[0].peak_rss_mb for s in side):.0f} MB,"
                f" threads started {max(s[1] for s in side)} (most alive {max(s[2] for s in side)})"
            )


if __name__ == "__main__":
    main()
