"""Instructions per task, plugin against plain pytest, counted by callgrind: a figure the neighbours cannot move.

Wall and CPU time on these machines move by a third for the same code from
one run to the next (docs/performance.md, set O), more than the gap being
measured. ``valgrind --tool=callgrind`` counts the instructions a process
executes in user space instead: the same program on the same input gives
the same count to a fraction of a percent, whatever else the machine does.

Each side runs the no-op suite of ``bench_overhead.py`` at two sizes; the
difference between them, divided by the difference in tasks, is what one
more task costs, start-up and the end of the session cancelled out. The
count at ``--n`` is then projected from both (fixed part plus ``n`` times the
per-task part) and compared with plain pytest's projected the same way.

What the count leaves out: the kernel's work (a file created per task costs
system CPU that depends on the file system, see set M), waiting, and the
cost of an instruction (cache misses, a slow ``malloc``). Read it next to
the CPU time of ``bench_ab.py``, not instead of it. Usage::

    python perf/bench_instructions.py [--small 1000] [--large 3000] [--n 10000] [--junit] \\
        [--checkout /var/tmp/ab/a --checkout /var/tmp/ab/b]

Without ``--checkout`` the installed plugin is measured. Each run takes 50-100
times as long as without valgrind (about a minute per 1,000 tasks here).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from _common import child_env, describe_filesystem, plugin_cmd, pytest_cmd, write_plain_suite
from bench_overhead import NOOP, NOOP_SYNC, write_noop_suite

_FIRST_PID = re.compile(r"^==(\d+)==", re.MULTILINE)


def instructions(cmd: list[str], cwd: Path, env: dict[str, str]) -> int:
    """User-space instructions ``cmd`` executes (callgrind's ``Ir``), threads included, children not."""
    out = cwd / "callgrind.out"
    proc = subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *cmd],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
    )
    out.unlink(missing_ok=True)
    # A child forked by pytest or a plugin prints its own summary, with the counts it inherited
    # at the fork; the one to read is the summary of the process valgrind started.
    pid = _FIRST_PID.search(proc.stderr)
    found = pid and re.search(rf"^=={pid.group(1)}== Collected : (\d+)$", proc.stderr, re.MULTILINE)
    if proc.returncode != 0 or not found:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
        raise SystemExit(f"{' '.join(cmd)} failed under valgrind (exit {proc.returncode}):\n" + "\n".join(tail))
    return int(found.group(1))


def side(root: Path, name: str, size: int, args: argparse.Namespace, env: dict[str, str]) -> int:
    """One suite of ``size`` tasks in its own folder, run once to write bytecode caches, then counted."""
    folder = root / f"{name}-{size}"
    folder.mkdir()
    extra = (f"--junitxml={folder / 'junit.xml'}",) if args.junit else ()
    if name == "plain":
        write_plain_suite(folder, size)
        cmd = pytest_cmd("plain", *extra)
    else:
        write_noop_suite(folder, size, args.concurrency, NOOP_SYNC if args.sync else NOOP)
        cmd = plugin_cmd(*extra)
    warm = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True)
    if warm.returncode != 0:
        raise SystemExit(f"{name} at {size} tasks failed (exit {warm.returncode}): {warm.stdout[-500:]}")
    shutil.rmtree(folder / "runs", ignore_errors=True)  # the counted run starts from nothing, not a resume
    count = instructions(cmd, folder, env)
    print(f"{name:>8} at {size:>6}: {count / 1e9:8.3f} G instructions", flush=True)
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", type=int, default=1000)
    parser.add_argument("--large", type=int, default=3000)
    parser.add_argument("--n", type=int, default=10_000, help="the size the ratio is projected to")
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--junit", action="store_true", help="--junitxml on every run, plain pytest's included")
    parser.add_argument("--sync", action="store_true", help="sync run_task and evaluate (two thread hops per task)")
    parser.add_argument(
        "--checkout", action="append", type=Path, default=[], help="a folder holding pytest_agentcompass/ (repeatable)"
    )
    parser.add_argument("--dir", default=None, help="where the suites run (default: the temp dir)")
    parser.add_argument(
        "--no-plain", action="store_true", help="checkouts only, compared with the first (plain's count known)"
    )
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    sides: dict[str, dict[str, str]] = {} if args.no_plain else {"plain": child_env()}
    if args.checkout:
        for path in args.checkout:
            sides[path.name] = {**child_env(), "PYTHONPATH": str(path.resolve())}
    else:
        sides["plugin"] = child_env()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        print(f"suites on: {describe_filesystem(root)} (the count does not depend on it)")
        per_task: dict[str, float] = {}
        projected: dict[str, float] = {}
        for name, env in sides.items():
            small = side(root, name, args.small, args, env)
            large = side(root, name, args.large, args, env)
            per_task[name] = (large - small) / (args.large - args.small)
            projected[name] = small + per_task[name] * (args.n - args.small)
        first = next(iter(sides))
        for name in sides:
            print(
                f"{name:>8}: {per_task[name] / 1e3:7.0f} K instructions per task"
                f" ({per_task[name] / per_task[first]:.3f}x {first}'s),"
                f" {(projected[name] - per_task[name] * args.n) / 1e9:.2f} G fixed;"
                f" at {args.n} tasks {projected[name] / 1e9:.2f} G"
                f" ({projected[name] / projected[first]:.3f}x {first}'s)"
            )
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        print("(children ran with bytecode caches: PYTHONDONTWRITEBYTECODE was dropped for them)")


if __name__ == "__main__":
    main()
