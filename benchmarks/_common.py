"""Helpers shared by the benchmark scripts: child processes measured with wait4."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "Measurement",
    "child_env",
    "describe_filesystem",
    "interleaved",
    "measure",
    "print_medians",
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
    return f"{best[1]} ({best[2]} on {best[0] or '?'})"


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


def measure(cmd: list[str], cwd: Path) -> Measurement:
    """Wall time and peak RSS of one child process (``ru_maxrss`` of that child alone)."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    cpu = usage.ru_utime + usage.ru_stime
    tail = out.strip().splitlines()[-1] if out else ""
    return Measurement(elapsed, cpu, usage.ru_maxrss / 1024, proc.returncode, tail)


def write_plain_suite(root: Path, n: int) -> None:
    """``root/plain``: n trivial plain pytest tests, the baseline of every comparison."""
    plain = root / "plain"
    plain.mkdir(exist_ok=True)
    (plain / "test_plain.py").write_text(
        f"import pytest\n\n@pytest.mark.parametrize('i', range({n}))\ndef test_noop(i):\n    pass\n"
    )


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
    # Unmeasured: writes the bytecode caches both sides then find (see child_env).
    measure(pytest_cmd("--collect-only", "plain"), root)
    measure(pytest_cmd("--agentcompass=agentcompass.yaml", "--collect-only", *extra), root)
    for _ in range(repeat):
        base = measure(pytest_cmd("plain", *extra), root)
        plugin = measure(pytest_cmd("--agentcompass=agentcompass.yaml", "--agentcompass-progress=off", *extra), root)
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
