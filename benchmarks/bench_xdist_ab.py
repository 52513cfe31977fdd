"""Two checkouts of the plugin on the xdist workload of ``bench_xdist.py``, with plain pytest, alternated.

Each round runs plain pytest ``-n 2`` on 10,000 trivial tests, then both
checkouts (which goes first alternates) on 10,000 tasks of 50 ms at
concurrency 500 under ``-n 2``, all in one temporary folder, each child with
``PYTHONPATH`` pointing at its checkout (a folder holding
``pytest_agentcompass/``, e.g. ``git archive <commit> pytest_agentcompass |
tar -x -C <folder>``). Alternating inside one run matters on this machine:
the ext4 under ``/tmp`` slows down for minutes after a run removes tens of
thousands of files, so whole runs one after the other favour whichever went
first. Usage::

    python benchmarks/bench_xdist_ab.py --a /tmp/base --b /tmp/new --rounds 4 [--dir /dev/shm]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from _common import Measurement, describe_filesystem, measure, pytest_cmd, write_plain_suite, write_suite
from bench_xdist import SLEEPER


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--a", type=Path, required=True, help="folder holding the first pytest_agentcompass/")
    parser.add_argument("--b", type=Path, required=True, help="folder holding the second pytest_agentcompass/")
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=0.05)
    parser.add_argument("--concurrency", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--dir", default=None, help="where the run directory goes (default: the temp dir)")
    args = parser.parse_args()
    checkouts = {"a": str(args.a.resolve()), "b": str(args.b.resolve())}
    ideal = args.n * args.seconds / args.concurrency
    xdist = ("-n", "2")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        print(f"run directory on: {describe_filesystem(root)}")
        request = (
            f"name: sleep\nbenchmark: {{id: 'sleeper.py:Sleeper', params: {{n: {args.n}, seconds: {args.seconds}}}}}"
        )
        write_suite(root, "sleeper", SLEEPER, args.concurrency, request)
        write_plain_suite(root, args.n)
        measure(pytest_cmd("--collect-only", "plain"), root)  # unmeasured: bytecode caches
        for path in checkouts.values():
            os.environ["PYTHONPATH"] = path
            measure(pytest_cmd("--agentcompass=agentcompass.yaml", "--collect-only"), root)
        plugin = pytest_cmd("--agentcompass=agentcompass.yaml", "--agentcompass-progress=off", *xdist)
        runs: dict[str, list[Measurement]] = {"plain": [], "a": [], "b": []}
        for round_ in range(args.rounds):
            runs["plain"].append(measure(pytest_cmd("plain", *xdist), root))
            for name in ("a", "b") if round_ % 2 == 0 else ("b", "a"):
                os.environ["PYTHONPATH"] = checkouts[name]
                run = measure(plugin, root)
                if run.returncode != 0:
                    raise SystemExit(f"{name} failed (exit {run.returncode}): {run.tail}")
                runs[name].append(run)
            print("  ".join(f"{k}: {v[-1].seconds:.1f}s wall {v[-1].cpu_seconds:.1f}s CPU" for k, v in runs.items()))
        plain_wall = statistics.median(m.seconds for m in runs["plain"])
        plain_cpu = statistics.median(m.cpu_seconds for m in runs["plain"])
        for name, measured in runs.items():
            wall = statistics.median(m.seconds for m in measured)
            cpu = statistics.median(m.cpu_seconds for m in measured)
            print(
                f"{name:>5}: median {wall:.2f}s wall ({wall / (ideal + plain_wall):.2f}x of ideal + plain),"
                f" {cpu:.2f}s CPU ({cpu / plain_cpu:.2f}x plain)"
            )


if __name__ == "__main__":
    main()
