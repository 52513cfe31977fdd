"""The command line: regenerate a run's HTML report, compare two runs.

``report RUN_DIR... [-o FILE] [--baseline FILE]`` writes ``RUN_DIR/report.html``
(through the run's store) or, with ``-o``, one page for every run given.
``compare OLD NEW`` prints regressions and improvements between two run
directories or baseline files and exits 1 when there is a regression. Two
single-request sides are compared whatever their request names (two agents
on one benchmark); otherwise requests are matched by name.

Exit codes: 0 done, 1 regressions (``compare``), 2 unusable input.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from ..vocabulary.errors import AgentCompassError
from .baseline import Baseline, Known, compare, load_baseline

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pytest_agentcompass", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    report = commands.add_parser("report", help="write the HTML report of run directories")
    report.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR")
    report.add_argument(
        "-o", "--output", type=Path, help="one page for all RUN_DIRs here (default: RUN_DIR/report.html)"
    )
    report.add_argument("--baseline", help="a baseline file or run directory: adds the 'change' column")
    diff = commands.add_parser("compare", help="regressions and improvements from OLD to NEW (exit 1 on regressions)")
    diff.add_argument("old", metavar="OLD", help="a run directory or a baseline file")
    diff.add_argument("new", metavar="NEW", help="a run directory or a baseline file")
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    args = _parser().parse_args(argv)
    out = out or sys.stdout
    try:
        if args.command == "report":
            return _report(args.run_dirs, args.output, args.baseline, out)
        return _compare(args.old, args.new, out)
    except AgentCompassError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (``| head``): it read what it wanted. Nothing more goes to the closed
        # pipe (the interpreter's last flush would fail again), and the exit says so as a shell tool's
        # does: 128 + SIGPIPE.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except OSError as exc:
        print(f"error: {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr)
        return 2


def _report(run_dirs: list[Path], output: Path | None, baseline_path: str | None, out: TextIO) -> int:
    from ..runtime.store.details import holds_details
    from ..runtime.store.files import RunStore
    from .html import write_run_report, write_session_report

    for run_dir in run_dirs:
        if not holds_details(run_dir) and not (run_dir / "summary.json").is_file():
            raise AgentCompassError(f"{run_dir}: not a run directory (no summary.json and no details/ folder)")
    baseline = load_baseline(baseline_path) if baseline_path else None
    if output is not None:
        print(f"wrote {write_session_report(output, run_dirs, baseline)}", file=out)
        return 0
    for run_dir in run_dirs:
        print(f"wrote {write_run_report(RunStore(run_dir), baseline)}", file=out)
    return 0


def _compare(old_path: str, new_path: str, out: TextIO) -> int:
    old, new = load_baseline(old_path), load_baseline(new_path)
    pairs = _pairs(old, new)
    if not pairs:
        raise AgentCompassError(
            f"no request in common: {old_path} has {sorted(old.requests)}, {new_path} has {sorted(new.requests)}"
        )
    regressions = 0
    for label, before, after in pairs:
        changes = compare(before, after)
        regressions += len(changes.regressions)
        print(
            f"{label}: {len(changes.regressions)} regression(s), {len(changes.improvements)} improvement(s), "
            f"{len(changes.still_failing)} still failing, {len(changes.new)} new, {len(changes.missing)} missing",
            file=out,
        )
        for kind, ids in (("regression", changes.regressions), ("improvement", changes.improvements)):
            for task_id in ids:
                print(f"  {kind}: {task_id} ({_show(before[task_id])} -> {_show(after[task_id])})", file=out)
    return 1 if regressions else 0


def _pairs(old: Baseline, new: Baseline) -> list[tuple[str, dict[str, Known], dict[str, Known]]]:
    if len(old.requests) == 1 and len(new.requests) == 1:
        (a, tasks_a), (b, tasks_b) = next(iter(old.requests.items())), next(iter(new.requests.items()))
        return [(a if a == b else f"{a} -> {b}", tasks_a, tasks_b)]
    return [(name, old.requests[name], new.requests[name]) for name in old.requests if name in new.requests]


def _show(known: Known) -> str:
    return known.state + (f" {known.score:g}" if isinstance(known.score, int | float) else "")
