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

    python perf/bench_xdist_ab.py --a /tmp/base --b /tmp/new --rounds 4 [--dir /dev/shm] [--controller-end]

``--controller-end`` also times the controller's finalization of the run
(``ControllerRun._finalize_all``: the details taken, the summary, the page,
after the last task), CPU and wall, with a conftest in the suite's folder,
and says each checkout's medians: the part of a run's end no worker shares.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

from _common import ab_parser, alternate_checkouts, describe_filesystem, write_plain_suite, write_suite
from bench_xdist import SLEEPER

#: Times the controller's finalization (``--controller-end``): one line per run, to ``controller-end.txt``.
END_TIMER = """import os, time

def pytest_configure(config):
    if hasattr(config, "workerinput") or not config.getoption("agentcompass", None):
        return
    from pytest_agentcompass.plugin.controller import ControllerRun
    finalize = ControllerRun._finalize_all

    def timed(self, *args, **kwargs):
        if self.finalized:
            return finalize(self, *args, **kwargs)
        cpu, wall = time.process_time(), time.perf_counter()
        try:
            return finalize(self, *args, **kwargs)
        finally:
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            with open(os.path.join(str(config.rootpath), "controller-end.txt"), "a") as out:
                out.write(f"{os.environ.get('PYTHONPATH', '')} {cpu:.3f} {wall:.3f}\\n")

    ControllerRun._finalize_all = timed
"""


def main() -> None:
    parser = ab_parser(__doc__, concurrency=500)
    parser.add_argument("--seconds", type=float, default=0.05)
    parser.add_argument("--controller-end", action="store_true", help="time the controller's finalization too")
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
        if args.controller_end:
            (root / "conftest.py").write_text(END_TIMER)
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
        if args.controller_end:
            print_controller_end(root / "controller-end.txt", {"a": args.a, "b": args.b})


def print_controller_end(log: Path, checkouts: dict[str, Path]) -> None:
    """Each checkout's finalization times as the conftest wrote them (the collect-only runs write none)."""
    timed: dict[str, list[tuple[float, float]]] = {str(p.resolve()): [] for p in checkouts.values()}
    for line in log.read_text().splitlines():
        path, cpu, wall = line.rsplit(" ", 2)
        timed.setdefault(path, []).append((float(cpu), float(wall)))
    for name, path in checkouts.items():
        times = timed[str(path.resolve())]
        cpus = ", ".join(f"{cpu:.2f}" for cpu, _ in times)
        print(
            f"{name:>5}: controller's finalization, median {statistics.median(c for c, _ in times):.2f}s CPU"
            f" ({cpus}), {statistics.median(w for _, w in times):.2f}s wall"
        )


if __name__ == "__main__":
    main()
