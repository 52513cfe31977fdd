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

    python perf/bench_xdist_ab.py --a /tmp/base --b /tmp/new --rounds 4 [--dir /dev/shm]
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

from _common import ab_parser, alternate_checkouts, describe_filesystem, write_plain_suite, write_suite
from bench_xdist import SLEEPER


def main() -> None:
    parser = ab_parser(__doc__, concurrency=500)
    parser.add_argument("--seconds", type=float, default=0.05)
    args = parser.parse_args()
    ideal = args.n * args.seconds / args.concurrency
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        print(f"run directory on: {describe_filesystem(root)}")
        request = (
            f"name: sleep\nbenchmark: {{id: 'sleeper.py:Sleeper', params: {{n: {args.n}, seconds: {args.seconds}}}}}"
        )
        write_suite(root, "sleeper", SLEEPER.replace("{cpu}", "0.0"), args.concurrency, request)  # tasks only wait
        write_plain_suite(root, args.n)
        runs = alternate_checkouts(root, {"a": args.a, "b": args.b}, args.rounds, ("-n", "2"))
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
