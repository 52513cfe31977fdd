"""Scale-out under pytest-xdist: N tasks of D seconds each at a run-wide concurrency, with ``-n W``.

The target compares the plugin under ``-n W`` with what the work cannot go
below: the ideal time (N * D / concurrency) plus plain pytest under ``-n W``
running N trivial tests, both measured in the same run, alternated::

    python perf/bench_xdist.py --n 10000 --seconds 0.05 --concurrency 500 --workers 2 [--sync] [--dir /dev/shm]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _common import interleaved, print_medians, write_plain_suite, write_suite

SLEEPER = """
import asyncio, dataclasses
from pytest_agentcompass import HarnessFreeBenchmark, RunResult, TaskSpec

class Sleeper(HarnessFreeBenchmark):
    evaluation_environment_mode = "none"
    def __init__(self, n, seconds):
        super().__init__(n=n, seconds=seconds)
        self.n, self.seconds = n, seconds
    def load_tasks(self, req):
        return [TaskSpec(f"t{i}") for i in range(self.n)]
    async def run_task(self, task, prepared, env, req, plan):
        await asyncio.sleep(self.seconds)  # an agent waiting on a model or a container
        return RunResult(task.task_id, output="ok")
    async def evaluate(self, task, prepared, result, req, plan, env=None):
        return dataclasses.replace(result, score=1.0)
"""

#: The same with a plain ``def evaluate``: each call hops to a thread so it cannot block the loop.
SLEEPER_SYNC = SLEEPER.replace("async def evaluate", "def evaluate")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=0.05)
    parser.add_argument("--concurrency", type=int, default=500)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--sync", action="store_true", help="a sync evaluate (a thread hop per task)")
    parser.add_argument("--dir", default=None, help="where the run directory goes (default: the temp dir)")
    args = parser.parse_args()
    ideal = args.n * args.seconds / args.concurrency
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        request = (
            f"name: sleep\nbenchmark: {{id: 'sleeper.py:Sleeper', params: {{n: {args.n}, seconds: {args.seconds}}}}}"
        )
        write_suite(root, "sleeper", SLEEPER_SYNC if args.sync else SLEEPER, args.concurrency, request)
        write_plain_suite(root, args.n)
        pairs = []
        for base, plugin in interleaved(root, args.repeat, ("-n", str(args.workers))):
            pairs.append((base, plugin))
            print(f"n={args.n} x {args.seconds}s at concurrency {args.concurrency}, -n {args.workers}")
            print(f"  plain pytest -n : {base.seconds:7.2f}s  CPU {base.cpu_seconds:6.2f}s  [{base.tail}]")
            print(f"  agentcompass -n : {plugin.seconds:7.2f}s  CPU {plugin.cpu_seconds:6.2f}s  [{plugin.tail}]")
            ratio = plugin.seconds / (ideal + base.seconds)
            print(f"  ratio to ideal {ideal:.2f}s + plain: {ratio:.2f}x (target <= 1.3x)")
        print_medians(pairs, ideal=ideal)


if __name__ == "__main__":
    main()
