"""Throughput of one Docker engine against a pool of two, for a container-bound workload.

Starts two extra engines (each ``dockerd`` in a network namespace of its own,
with the test image; needs root, as the test fixture does), then runs the same
N tasks against one engine and against both, alternated, each engine limited
to ``--capacity`` sessions at once. Each task holds its container for
``--seconds`` (``sleep`` inside it): what bounds the run is the engine's
slots, not this machine's CPU, which both engines share::

    python perf/bench_engines.py --n 48 --seconds 2 --capacity 4 --repeat 3

Figures: wall time and CPU (user + system, of pytest and its children; the
engines' own CPU is not in it) of the whole pytest process, and the tasks'
span (first start to last end, from the tasks' own records) with the
throughput it gives.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from _common import Measurement, measure, pytest_cmd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "suites"))
from engines import IMAGE, Engines  # the test suite's engine helper

SUITE = Path(__file__).resolve().parent.parent / "tests" / "suites" / "pool_tasks.py"


def config(root: Path, name: str, urls: list[str], args: argparse.Namespace) -> Path:
    events = root / f"{name}.jsonl"
    engines = [{"url": url, "capacity": args.capacity} for url in urls]
    request = {
        "name": name,
        "benchmark": {
            "id": f"{SUITE}:PoolTasks",
            "params": {"n": args.n, "sleep": {"*": args.seconds}, "events": str(events)},
        },
        "environment": {
            "id": "docker",
            "network": {"baseline": "disabled", "run": "disabled", "evaluation": "disabled"},
            "params": {"image": IMAGE, "engines": engines},
        },
    }
    path = root / f"{name}.yaml"
    data = {"output_dir": "runs", "task_concurrency": args.capacity * len(urls), "requests": [request]}
    path.write_text(json.dumps(data))  # YAML is a superset of JSON
    return path


def span(events: Path) -> float:
    """Seconds from the first task's start to the last one's end (from the records' order and times)."""
    times = [json.loads(line)["t"] for line in events.read_text().splitlines()]
    return max(times) - min(times)


def run(root: Path, name: str, cfg: Path) -> tuple[Measurement, float]:
    events = root / f"{name}.jsonl"
    events.unlink(missing_ok=True)
    result = measure(pytest_cmd(f"--agentcompass={cfg}", "--agentcompass-progress=off"), root)
    if result.returncode != 0:
        raise SystemExit(f"{name} failed (exit {result.returncode}): {result.tail}")
    return result, span(events)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=48)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--capacity", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    pool = Engines(2)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            one = config(root, "one", [pool.engines[0].url], args)
            two = config(root, "two", [e.url for e in pool.engines], args)
            rows: list[tuple[Measurement, float, Measurement, float]] = []
            for index in range(args.repeat):
                a, a_span = run(root, "one", one)
                b, b_span = run(root, "two", two)
                rows.append((a, a_span, b, b_span))
                print(f"round {index + 1}: {args.n} tasks x {args.seconds}s, capacity {args.capacity} per engine")
                print(f"  one engine : {a.seconds:6.2f}s wall  CPU {a.cpu_seconds:5.2f}s  tasks' span {a_span:6.2f}s")
                print(f"  two engines: {b.seconds:6.2f}s wall  CPU {b.cpu_seconds:5.2f}s  tasks' span {b_span:6.2f}s")
                print(f"  throughput two/one: wall {a.seconds / b.seconds:.2f}x, span {a_span / b_span:.2f}x")
            med = statistics.median
            one_wall, two_wall = med(r[0].seconds for r in rows), med(r[2].seconds for r in rows)
            one_span, two_span = med(r[1] for r in rows), med(r[3] for r in rows)
            print(
                f"medians: one {one_wall:.2f}s (CPU {med(r[0].cpu_seconds for r in rows):.2f}s, span {one_span:.2f}s), "
                f"two {two_wall:.2f}s (CPU {med(r[2].cpu_seconds for r in rows):.2f}s, span {two_span:.2f}s)"
            )
            print(
                f"throughput two/one: wall {one_wall / two_wall:.2f}x, span {one_span / two_span:.2f}x (target >= 1.8x)"
            )
    finally:
        pool.close()


if __name__ == "__main__":
    main()
