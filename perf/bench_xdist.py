"""Scale-out under pytest-xdist: N tasks of D seconds each at a run-wide concurrency, with ``-n W``.

The target compares the plugin under ``-n W`` with what the work cannot go
below: the ideal time (N * D / concurrency) plus plain pytest under ``-n W``
running N trivial tests, both measured in the same run, alternated::

    python perf/bench_xdist.py --n 10000 --seconds 0.05 --concurrency 500 --workers 2 [--sync] [--dir /dev/shm]

``--in-process`` compares instead the plugin under ``-n W`` with the plugin in
one process (which goes first alternates), and plain pytest likewise, for the
other target: ``-n W`` at least as fast as one process. ``--cpu MS`` makes each
task's ``run_task`` also compute for MS milliseconds of CPU (a busy loop on the
thread's CPU clock): work a second process can take, which waiting is not::

    python perf/bench_xdist.py --n 10000 --seconds 0.05 --concurrency 500 --in-process --repeat 4
    python perf/bench_xdist.py --n 2000 --seconds 0 --cpu 5 --concurrency 100 --in-process --repeat 4
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from _common import (
    Measurement,
    interleaved,
    measure,
    plugin_cmd,
    print_medians,
    pytest_cmd,
    write_plain_suite,
    write_suite,
)

SLEEPER = """
import asyncio, dataclasses, time
from pytest_agentcompass import HarnessFreeBenchmark, RunResult, TaskSpec

CPU_SECONDS = {cpu}

class Sleeper(HarnessFreeBenchmark):
    evaluation_environment_mode = "none"
    def __init__(self, n, seconds):
        super().__init__(n=n, seconds=seconds)
        self.n, self.seconds = n, seconds
    def load_tasks(self, req):
        return [TaskSpec(f"t{i}") for i in range(self.n)]
    async def run_task(self, task, prepared, env, req, plan):
        await asyncio.sleep(self.seconds)  # an agent waiting on a model or a container
        until = time.thread_time() + CPU_SECONDS
        while time.thread_time() < until:  # work only a second process can share (--cpu)
            pass
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
    parser.add_argument("--in-process", action="store_true", help="-n W against one process, plugin and plain")
    parser.add_argument("--cpu", type=float, default=0.0, help="milliseconds of CPU each task computes")
    args = parser.parse_args()
    ideal = args.n * args.seconds / args.concurrency
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        request = (
            f"name: sleep\nbenchmark: {{id: 'sleeper.py:Sleeper', params: {{n: {args.n}, seconds: {args.seconds}}}}}"
        )
        source = (SLEEPER_SYNC if args.sync else SLEEPER).replace("{cpu}", repr(args.cpu / 1000))
        write_suite(root, "sleeper", source, args.concurrency, request)
        write_plain_suite(root, args.n)
        if args.in_process:
            return against_one_process(root, args.repeat, args.workers, args.n, args.cpu)
        pairs = []
        for base, plugin in interleaved(root, args.repeat, ("-n", str(args.workers))):
            pairs.append((base, plugin))
            print(f"n={args.n} x {args.seconds}s at concurrency {args.concurrency}, -n {args.workers}")
            print(f"  plain pytest -n : {base.seconds:7.2f}s  CPU {base.cpu_seconds:6.2f}s  [{base.tail}]")
            print(f"  agentcompass -n : {plugin.seconds:7.2f}s  CPU {plugin.cpu_seconds:6.2f}s  [{plugin.tail}]")
            ratio = plugin.seconds / (ideal + base.seconds)
            print(f"  ratio to ideal {ideal:.2f}s + plain: {ratio:.2f}x (target <= 1.3x)")
        print_medians(pairs, ideal=ideal)


#: Plain tests that compute as long as ``--cpu`` makes each task compute.
PLAIN_WORK = """import time

import pytest


@pytest.mark.parametrize("i", range({n}))
def test_work(i):
    until = time.thread_time() + {cpu!r}
    while time.thread_time() < until:
        pass
"""


def against_one_process(root: Path, repeat: int, workers: int, n: int, cpu: float) -> None:
    """The plugin under ``-n workers`` against the plugin in one process, and plain pytest likewise (its
    tests computing as long as the tasks do): every round runs the four, which goes first alternating."""
    plain = root / "plain"
    plain.mkdir(exist_ok=True)
    (plain / "test_plain.py").write_text(PLAIN_WORK.format(n=n, cpu=cpu / 1000))
    sides = {
        "plugin, one process": plugin_cmd(),
        f"plugin, -n {workers}": plugin_cmd("-n", str(workers)),
        "plain, one process": pytest_cmd("plain"),
        f"plain, -n {workers}": pytest_cmd("plain", "-n", str(workers)),
    }
    for cmd in (plugin_cmd("--collect-only"), pytest_cmd("plain", "--collect-only")):
        measure(cmd, root)  # writes the bytecode caches
    runs: dict[str, list[Measurement]] = {name: [] for name in sides}
    for round_ in range(repeat):
        names = list(sides) if round_ % 2 == 0 else [*list(sides)[1::-1], *list(sides)[:1:-1]]
        for name in names:
            run = measure(sides[name], root)
            if run.returncode != 0:
                raise SystemExit(f"{name} run failed (exit {run.returncode}): {run.tail}")
            runs[name].append(run)
        line = ", ".join(
            f"{name} {runs[name][-1].seconds:.2f}s/{runs[name][-1].cpu_seconds:.2f}s CPU" for name in sides
        )
        print(f"round {round_ + 1}: {line}")
    for who in ("plugin", "plain"):
        one, spread = runs[f"{who}, one process"], runs[f"{who}, -n {workers}"]
        ratios = [x.seconds / o.seconds for o, x in zip(one, spread, strict=True)]
        wall = [statistics.median(r.seconds for r in side) for side in (one, spread)]
        cpu_s = [statistics.median(r.cpu_seconds for r in side) for side in (one, spread)]
        print(
            f"{who}: -n {workers} / one process, pairwise {', '.join(f'{r:.2f}' for r in ratios)}; "
            f"median {statistics.median(ratios):.2f}x; wall medians {wall[0]:.2f}s / {wall[1]:.2f}s; "
            f"CPU medians {cpu_s[0]:.2f}s / {cpu_s[1]:.2f}s"
        )


if __name__ == "__main__":
    main()
