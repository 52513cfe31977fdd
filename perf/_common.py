"""Helpers shared by the benchmark scripts: child processes measured with wait4."""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "Measurement",
    "ab_parser",
    "alternate_checkouts",
    "child_env",
    "describe_filesystem",
    "file_creation_cost",
    "interleaved",
    "measure",
    "print_medians",
    "plugin_cmd",
    "pytest_cmd",
    "write_plain_suite",
    "write_suite",
]


@dataclass(frozen=True)
class Measurement:
    seconds: float
    cpu_seconds: float  # user + system: less sensitive than wall time to a busy neighbour
    peak_rss_mb: float
    returncode: int
    tail: str
    machine_cpu_seconds: float = 0.0  # the whole machine's meanwhile (see machine_cpu_seconds())


def describe_filesystem(path: Path) -> str:
    """``<fstype> (<device> on <mount point>)`` for ``path``: file system speed decides much of a task's cost."""
    target = os.path.realpath(path)
    best = ("", "unknown", "?")
    try:
        with open("/proc/self/mounts") as mounts:  # Linux; elsewhere the type stays unknown
            for line in mounts:
                device, mount, fstype = line.split()[:3]
                mount = mount.replace("\\040", " ")
                inside = target == mount or target.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best[0]):
                    best = (mount, fstype, device)
    except OSError:
        pass
    journal = ""
    if best[1] == "ext4":
        # ext4 without a journal passes over the inodes removed in the last
        # minutes each time it allocates one (fs/ext4/ialloc.c,
        # find_inode_bit: check_recently_deleted), so a file costs far more
        # there after a suite's removals; say which kind this is.
        try:
            task = Path(f"/sys/fs/ext4/{os.path.basename(best[2])}/journal_task").read_text().strip()
            journal = ", no journal" if task == "<none>" else ", journaled"
        except OSError:
            pass
    return f"{best[1]}{journal} ({best[2]} on {best[0] or '?'})"


def file_creation_cost(path: Path, files: int = 200) -> float:
    """CPU microseconds this process spends creating one empty file in a new folder under ``path``, now.

    A task writes one detail file, so this is the floor of a task's cost on
    that file system at that moment. It moves a lot: on this machine's ext4,
    in a folder of a block group where many files were just removed (a test
    suite's runs, an earlier benchmark's temporary folder), one creation took
    400-800 us of kernel CPU, against about 20 us elsewhere on the same disk.
    """
    probe = path / f".probe-{os.getpid()}"
    probe.mkdir()
    try:
        before = resource.getrusage(resource.RUSAGE_SELF)
        for i in range(files):
            os.close(os.open(probe / f"f{i}.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        after = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        shutil.rmtree(probe)
    spent = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return spent / files * 1e6


def machine_cpu_seconds() -> float:
    """CPU seconds the whole machine has spent so far (``/proc/stat``: user, nice, system, irq, softirq).

    The only figure that holds a Docker engine's work: the daemon, the shims and
    ``runc`` of every container, the containers' own processes and the kernel's
    mounts. It also holds whatever else runs, so read it on a quiet machine, per
    side, over the same rounds. 0.0 where ``/proc/stat`` is not readable.
    """
    try:
        with open("/proc/stat") as stat:
            fields = [int(v) for v in stat.readline().split()[1:8]]
    except (OSError, ValueError):
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq = fields
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def child_env() -> dict[str, str]:
    """The children's environment: as a user's install has it, with bytecode caches.

    Without them every run would compile the plugin's modules and pytest
    would assertion-rewrite them again (an entry-point plugin is rewritten),
    which is a cost of this machine's setting, not of the plugin.
    """
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def pytest_cmd(*args: str) -> list[str]:
    # Plugins that are installed here but unrelated to the comparison stay out of both sides.
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", *args]


def plugin_cmd(*args: str, config: str = "agentcompass.yaml") -> list[str]:
    """pytest on the ``config`` of the folder it runs in, without the progress line."""
    return pytest_cmd(f"--agentcompass={config}", "--agentcompass-progress=off", *args)


def measure(cmd: list[str], cwd: Path) -> Measurement:
    """Wall time and peak RSS of one child process (``ru_maxrss`` of that child alone)."""
    machine = machine_cpu_seconds()
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    cpu = usage.ru_utime + usage.ru_stime
    tail = out.strip().splitlines()[-1] if out else ""
    machine = machine_cpu_seconds() - machine
    return Measurement(elapsed, cpu, usage.ru_maxrss / 1024, proc.returncode, tail, machine)


def write_plain_suite(root: Path, n: int, frozen_exit: bool = False) -> None:
    """``root/plain``: n trivial plain pytest tests, the baseline of every comparison.

    ``frozen_exit``: plain pytest's process also skips the interpreter's
    collections at exit, as the plugin's does (``gc_tuning.skip_exit_collections``):
    the comparison then leaves out a cost only plain pytest still pays.
    """
    plain = root / "plain"
    plain.mkdir(exist_ok=True)
    (plain / "test_plain.py").write_text(
        f"import pytest\n\n@pytest.mark.parametrize('i', range({n}))\ndef test_noop(i):\n    pass\n"
    )
    if frozen_exit:
        (plain / "conftest.py").write_text("import atexit\nimport gc\n\natexit.register(gc.freeze)\n")


def write_suite(root: Path, module: str, source: str, concurrency: int, request: str) -> None:
    """``root/<module>.py`` plus an ``agentcompass.yaml`` with one request (given as YAML lines)."""
    (root / f"{module}.py").write_text(source)
    lines = "\n".join("    " + line for line in request.strip().splitlines())
    (root / "agentcompass.yaml").write_text(
        f"output_dir: runs\ntask_concurrency: {concurrency}\nrequests:\n  - {lines.lstrip()}\n"
    )


def interleaved(root: Path, repeat: int, extra: tuple[str, ...] = ()) -> Iterator[tuple[Measurement, Measurement]]:
    """(plain, plugin) pairs, alternated so a noisy neighbour hurts both sides alike; ``extra`` goes to both."""
    print(f"run directory and workspaces on: {describe_filesystem(root)}")
    print(f"creating a file there: {file_creation_cost(root):.0f} us of CPU")
    # Unmeasured: writes the bytecode caches both sides then find (see child_env).
    measure(pytest_cmd("--collect-only", "plain"), root)
    measure(pytest_cmd("--agentcompass=agentcompass.yaml", "--collect-only", *extra), root)
    for _ in range(repeat):
        base = measure(pytest_cmd("plain", *extra), root)
        plugin = measure(plugin_cmd(*extra), root)
        for name, run in (("plain pytest", base), ("agentcompass", plugin)):
            # A run that broke finishes fast; its time must never pass for a result.
            if run.returncode != 0:
                raise SystemExit(f"{name} run failed (exit {run.returncode}): {run.tail}")
        yield base, plugin


def print_medians(pairs: list[tuple[Measurement, Measurement]], ideal: float = 0.0) -> None:
    """Pairwise ratios are what a target is read against; medians of each side show the noise apart."""
    ratios = [plugin.seconds / (ideal + base.seconds) for base, plugin in pairs]
    base_wall = statistics.median(b.seconds for b, _ in pairs)
    plugin_wall = statistics.median(p.seconds for _, p in pairs)
    base_cpu = statistics.median(b.cpu_seconds for b, _ in pairs)
    plugin_cpu = statistics.median(p.cpu_seconds for _, p in pairs)
    print(f"pairwise ratios: {', '.join(f'{r:.2f}' for r in ratios)}")
    print(f"median ratio over {len(ratios)} run(s): {statistics.median(ratios):.2f}x")
    print(
        f"medians: plain {base_wall:.2f}s, plugin {plugin_wall:.2f}s -> {plugin_wall / (ideal + base_wall):.2f}x;"
        f" CPU plain {base_cpu:.2f}s, plugin {plugin_cpu:.2f}s -> {plugin_cpu / base_cpu:.2f}x"
    )


def ab_parser(doc: str | None, concurrency: int) -> argparse.ArgumentParser:
    """The options every A/B script takes: two checkouts, the workload's size, rounds, where to run."""
    parser = argparse.ArgumentParser(description=doc)
    parser.add_argument("--a", type=Path, required=True, help="folder holding the first pytest_agentcompass/")
    parser.add_argument("--b", type=Path, required=True, help="folder holding the second pytest_agentcompass/")
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=concurrency)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--dir", default=None, help="where the run directory goes (default: the temp dir)")
    return parser


def alternate_checkouts(
    root: Path,
    checkouts: dict[str, Path],
    rounds: int,
    extra: tuple[str, ...] = (),
    configs: dict[str, str] | None = None,
) -> dict[str, list[Measurement]]:
    """Rounds of plain pytest then both checkouts (which goes first alternates), each with its ``PYTHONPATH``.

    ``root`` holds ``plain/`` and an ``agentcompass.yaml``; ``extra`` goes to every run (``-n 2``);
    ``configs`` names another config file in ``root`` for a checkout.
    Prints each round, then medians of wall and CPU time against plain pytest's.
    """
    configs = configs or {}
    paths = {name: str(path.resolve()) for name, path in checkouts.items()}
    measure(pytest_cmd("--collect-only", "plain"), root)  # unmeasured: bytecode caches
    for path in paths.values():
        os.environ["PYTHONPATH"] = path
        measure(pytest_cmd("--agentcompass=agentcompass.yaml", "--collect-only"), root)
    runs: dict[str, list[Measurement]] = {"plain": [], **{name: [] for name in paths}}
    names = list(paths)
    for round_ in range(rounds):
        # Said each round: it is the floor of a task's cost, and it drifts (file_creation_cost).
        print(f"creating a file in the run directory: {file_creation_cost(root):.0f} us of CPU", flush=True)
        runs["plain"].append(measure(pytest_cmd("plain", *extra), root))
        for name in names if round_ % 2 == 0 else names[::-1]:
            os.environ["PYTHONPATH"] = paths[name]
            run = measure(plugin_cmd(*extra, config=configs.get(name, "agentcompass.yaml")), root)
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
    return runs
