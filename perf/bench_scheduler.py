"""Scheduler overhead: tasks whose harness awaits a sleep, many at once.

Ideal wall time is n * sleep / concurrency; the reference adds what plain
pytest needs to report n items, measured in the same run. Usage::

    python perf/bench_scheduler.py --n 10000 --concurrency 500 --sleep 0.05
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _common import interleaved, print_medians, write_plain_suite, write_suite

SUITE = """
import asyncio, dataclasses
from pytest_agentcompass import BaseBenchmark, BaseHarness, RunResult, TaskSpec

class Many(BaseBenchmark):
    def __init__(self, n):
        super().__init__(n=n)
        self.n = n
    def load_tasks(self, req):
        return [TaskSpec(f"t{i}") for i in range(self.n)]
    def evaluate(self, task, prepared, result, req, plan, env=None):
        return dataclasses.replace(result, score=1.0)

class Sleeper(BaseHarness):
    async def run(self, session, task, prepared, env, req, plan):
        await asyncio.sleep(self.params["sleep"])
        return RunResult(task.task_id, output="ok")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=500)
    parser.add_argument("--sleep", type=float, default=0.05)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        request = (
            f"name: many\nbenchmark: {{id: 'suite.py:Many', params: {{n: {args.n}}}}}\n"
            f"harness: {{id: 'suite.py:Sleeper', params: {{sleep: {args.sleep}}}}}"
        )
        write_suite(root, "suite", SUITE, args.concurrency, request)
        write_plain_suite(root, args.n)
        ideal = args.n * args.sleep / args.concurrency
        pairs = []
        for base, plugin in interleaved(root, args.repeat):
            pairs.append((base, plugin))
            reference = ideal + base.seconds
            print(f"n={args.n} concurrency={args.concurrency} sleep={args.sleep}s")
            print(f"  ideal sleeping time      : {ideal:7.2f}s")
            print(f"  plain pytest, n items    : {base.seconds:7.2f}s  [{base.tail}]")
            print(f"  reference (ideal + plain): {reference:7.2f}s")
            print(
                f"  agentcompass             : {plugin.seconds:7.2f}s  peak RSS {plugin.peak_rss_mb:.1f} MB  "
                f"[{plugin.tail}]"
            )
            print(f"  ratio to reference       : {plugin.seconds / reference:7.2f}x (target <= 1.15x)")
            print(
                f"  CPU seconds plugin/plain : {plugin.cpu_seconds:.2f}/{base.cpu_seconds:.2f}"
                f" = {plugin.cpu_seconds / base.cpu_seconds:.2f}x"
            )
        print_medians(pairs, ideal=ideal)


if __name__ == "__main__":
    main()
