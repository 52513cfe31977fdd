"""Two checkouts of the plugin on the no-op suite of ``bench_overhead.py``, with plain pytest, alternated.

Each round runs plain pytest, then both checkouts (which goes first
alternates), each as its own child with ``PYTHONPATH`` pointing at that
checkout. A checkout is a folder holding ``pytest_agentcompass/``, e.g. made
with ``git archive <commit> pytest_agentcompass | tar -x -C <folder>``. Usage::

    python benchmarks/bench_ab.py --a /tmp/base --b /tmp/new --n 10000 --rounds 4 [--dir /dev/shm] [--sync]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from _common import Measurement, describe_filesystem, measure, pytest_cmd, write_plain_suite, write_suite
from bench_overhead import NOOP, NOOP_SYNC


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--a", type=Path, required=True, help="folder holding the first pytest_agentcompass/")
    parser.add_argument("--b", type=Path, required=True, help="folder holding the second pytest_agentcompass/")
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--sync", action="store_true", help="a sync evaluate (a thread hop per task)")
    parser.add_argument("--dir", default=None, help="where the run directory goes (default: the temp dir)")
    args = parser.parse_args()
    checkouts = {"a": str(args.a.resolve()), "b": str(args.b.resolve())}
    plugin = pytest_cmd("--agentcompass=agentcompass.yaml", "--agentcompass-progress=off")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        print(f"run directory on: {describe_filesystem(root)}")
        request = f"name: noop\nbenchmark: {{id: 'noop.py:Noop', params: {{n: {args.n}}}}}"
        write_suite(root, "noop", NOOP_SYNC if args.sync else NOOP, args.concurrency, request)
        write_plain_suite(root, args.n)
        runs: dict[str, list[Measurement]] = {"plain": [], "a": [], "b": []}
        for path in checkouts.values():  # unmeasured: bytecode caches for both
            os.environ["PYTHONPATH"] = path
            measure(pytest_cmd("--agentcompass=agentcompass.yaml", "--collect-only"), root)
        for round_ in range(args.rounds):
            runs["plain"].append(measure(pytest_cmd("plain"), root))
            for name in ("a", "b") if round_ % 2 == 0 else ("b", "a"):
                os.environ["PYTHONPATH"] = checkouts[name]
                run = measure(plugin, root)
                if run.returncode != 0:
                    raise SystemExit(f"{name} failed (exit {run.returncode}): {run.tail}")
                runs[name].append(run)
            print(
                "  ".join(
                    f"{k}: {v[-1].seconds:.1f}s wall {v[-1].cpu_seconds:.2f}s CPU {v[-1].peak_rss_mb:.0f} MB"
                    for k, v in runs.items()
                ),
                flush=True,
            )
        plain_cpu = statistics.median(m.cpu_seconds for m in runs["plain"])
        for name, measured in runs.items():
            cpu = statistics.median(m.cpu_seconds for m in measured)
            print(
                f"{name:>5}: median {statistics.median(m.seconds for m in measured):.2f}s wall,"
                f" {cpu:.2f}s CPU ({cpu / plain_cpu:.2f}x plain),"
                f" peak RSS {statistics.median(m.peak_rss_mb for m in measured):.0f} MB"
            )


if __name__ == "__main__":
    main()
