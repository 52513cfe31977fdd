"""Plugin overhead: N no-op tasks through the plugin vs N trivial plain pytest tests.

Both sides are measured in the same run on the same machine, so the ratio is
what matters. Usage::

    python perf/bench_overhead.py --n 10000
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _common import interleaved, print_medians, write_plain_suite, write_suite

NOOP = """
import dataclasses
from pytest_agentcompass import HarnessFreeBenchmark, RunResult, TaskSpec

class Noop(HarnessFreeBenchmark):
    evaluation_environment_mode = "none"
    def __init__(self, n):
        super().__init__(n=n)
        self.n = n
    def load_tasks(self, req):
        return [TaskSpec(f"t{i}") for i in range(self.n)]
    async def run_task(self, task, prepared, env, req, plan):
        return RunResult(task.task_id, output="ok")
    async def evaluate(self, task, prepared, result, req, plan, env=None):
        return dataclasses.replace(result, score=1.0)
"""

#: The same with a plain ``def evaluate``: each call hops to a thread so it cannot block the loop.
#: As many users write a benchmark: plain ``def`` methods, each call handed to a worker thread.
NOOP_SYNC = NOOP.replace("async def evaluate", "def evaluate").replace("async def run_task", "def run_task")


def write_noop_suite(root: Path, n: int, concurrency: int, source: str = NOOP) -> None:
    """``root/noop.py`` (``source``: the no-op benchmark or a variant of it) and a config running ``n`` of its tasks."""
    write_suite(root, "noop", source, concurrency, f"name: noop\nbenchmark: {{id: 'noop.py:Noop', params: {{n: {n}}}}}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--sync", action="store_true", help="sync run_task and evaluate (two thread hops per task)")
    parser.add_argument("--dir", default=None, help="where the run directory goes (default: the temp dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        write_noop_suite(root, args.n, args.concurrency, NOOP_SYNC if args.sync else NOOP)
        write_plain_suite(root, args.n)
        pairs = []
        for base, plugin in interleaved(root, args.repeat):
            pairs.append((base, plugin))
            print(f"n={args.n}")
            print(f"  plain pytest : {base.seconds:7.2f}s  peak RSS {base.peak_rss_mb:6.1f} MB  [{base.tail}]")
            print(f"  agentcompass : {plugin.seconds:7.2f}s  peak RSS {plugin.peak_rss_mb:6.1f} MB  [{plugin.tail}]")
            print(f"  ratio        : {plugin.seconds / base.seconds:7.2f}x (target <= 1.5x, RSS < 300 MB)")
            print(
                f"  CPU seconds  : {plugin.cpu_seconds:.2f}/{base.cpu_seconds:.2f}"
                f" = {plugin.cpu_seconds / base.cpu_seconds:.2f}x"
            )
        print_medians(pairs)


if __name__ == "__main__":
    main()
