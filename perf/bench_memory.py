"""Peak RSS against the number of tasks: it should grow far slower than the task count.

Plain pytest is measured at the same sizes for reference. Usage::

    python perf/bench_memory.py --sizes 1000 10000 50000
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _common import interleaved, write_plain_suite
from bench_overhead import NOOP, write_noop_suite


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 50_000])
    parser.add_argument("--output-kb", type=int, default=0, help="size of each task's output (default: tiny)")
    args = parser.parse_args()
    print(
        f"{'tasks':>8} {'plain RSS':>10} {'plugin RSS':>11} {'plugin/plain':>13} {'KB/task':>8}"
        f" {'plain wall/CPU':>15} {'plugin wall/CPU':>16}"
    )
    first: tuple[int, float] | None = None
    for n in args.sizes:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            noop = NOOP
            if args.output_kb:
                noop = noop.replace('output="ok"', f'output="x" * {args.output_kb * 1024}')
            write_noop_suite(root, n, 64, noop)
            write_plain_suite(root, n)
            base, plugin = next(interleaved(root, 1))
            per_task = "" if first is None else f"{(plugin.peak_rss_mb - first[1]) * 1024 / (n - first[0]):8.1f}"
            first = first or (n, plugin.peak_rss_mb)
            print(
                f"{n:>8} {base.peak_rss_mb:>9.1f}M {plugin.peak_rss_mb:>10.1f}M "
                f"{plugin.peak_rss_mb / base.peak_rss_mb:>12.2f}x {per_task:>8}"
                f" {base.seconds:>7.1f}/{base.cpu_seconds:<6.1f}s {plugin.seconds:>8.1f}/{plugin.cpu_seconds:<6.1f}s"
            )


if __name__ == "__main__":
    main()
