"""Two checkouts of the plugin on the no-op suite of ``bench_overhead.py``, with plain pytest, alternated.

Each round runs plain pytest, then both checkouts (which goes first
alternates), each as its own child with ``PYTHONPATH`` pointing at that
checkout. A checkout is a folder holding ``pytest_agentcompass/``, e.g. made
with ``git archive <commit> pytest_agentcompass | tar -x -C <folder>``. Usage::

    python perf/bench_ab.py --a /tmp/base --b /tmp/new --n 10000 --rounds 4 \\
        [--dir /dev/shm] [--sync] [--junit] [--concurrency 100] [--layout-b journal]

``--layout-a``/``--layout-b`` set a side's ``execution.details_layout`` (the same
checkout on both sides then compares the two layouts). ``--plain-frozen-exit``
makes plain pytest's process skip the interpreter's collections at exit too,
as the plugin's does since issue 27's last change: a like-for-like figure
next to the one a user sees.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

from _common import ab_parser, alternate_checkouts, describe_filesystem, write_plain_suite
from bench_overhead import NOOP, NOOP_SYNC, write_noop_suite


def main() -> None:
    parser = ab_parser(__doc__, concurrency=64)
    parser.add_argument("--sync", action="store_true", help="sync run_task and evaluate (two thread hops per task)")
    parser.add_argument("--junit", action="store_true", help="--junitxml on every run, plain pytest's included")
    parser.add_argument("--plain-frozen-exit", action="store_true", help="plain pytest skips its exit collections too")
    for side in ("a", "b"):
        parser.add_argument(f"--layout-{side}", choices=("files", "journal"), help=f"{side}'s details layout")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        print(f"run directory on: {describe_filesystem(root)}")
        write_noop_suite(root, args.n, args.concurrency, NOOP_SYNC if args.sync else NOOP)
        write_plain_suite(root, args.n, frozen_exit=args.plain_frozen_exit)
        extra = (f"--junitxml={root / 'junit.xml'}",) if args.junit else ()
        configs = {}
        for side, layout in (("a", args.layout_a), ("b", args.layout_b)):
            if layout:
                configs[side] = f"agentcompass-{side}.yaml"
                text = (root / "agentcompass.yaml").read_text()
                (root / configs[side]).write_text(text + f"    execution: {{details_layout: {layout}}}\n")
                print(f"{side}: execution.details_layout: {layout}")
        runs = alternate_checkouts(root, {"a": args.a, "b": args.b}, args.rounds, extra, configs)
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
