"""The cost of one ``local`` exec: the reaped exec against a bare asyncio subprocess.

Each side runs N execs of ``true`` in a child process of its own, measured with
``wait4`` (wall and CPU of the whole process tree: the reaper server and the
per-exec reapers are waited for, so their CPU counts). The baseline is what
the provider did before the reaper: ``asyncio.create_subprocess_exec`` with
pipes, in a new session. Usage::

    python perf/bench_exec.py --n 500 --repeat 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from _common import describe_filesystem, measure

CHILD = """
import asyncio, sys
from pathlib import Path

N, SIDE, ROOT = int(sys.argv[1]), sys.argv[2], Path(sys.argv[3])

async def bare():
    for _ in range(N):
        proc = await asyncio.create_subprocess_exec(
            "true", stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True, cwd=ROOT,
        )
        await proc.communicate()

async def reaped():
    from pytest_agentcompass.environments.local import LocalSession
    from pytest_agentcompass.environments.process import shutdown_reaper
    session = LocalSession(ROOT / "ws")
    for _ in range(N):
        assert (await session.exec(["true"])).exit_code == 0
    await session.close()
    shutdown_reaper()  # waits for the server, so its CPU is in this tree's usage

asyncio.run(bare() if SIDE == "bare" else reaped())
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    repo = Path(__file__).resolve().parents[1]
    results: dict[str, list[tuple[float, float]]] = {"bare": [], "reaped": []}
    with tempfile.TemporaryDirectory() as tmp:
        print(f"workspaces on: {describe_filesystem(Path(tmp))}")
        for _ in range(args.repeat):
            for side in ("bare", "reaped"):  # interleaved: a noisy neighbour hurts both alike
                run = measure([sys.executable, "-c", CHILD, str(args.n), side, tmp], repo)
                if run.returncode != 0:
                    raise SystemExit(f"{side} failed: {run.tail}")
                results[side].append((run.seconds, run.cpu_seconds))
    per = {
        side: (statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs))
        for side, runs in results.items()
    }
    for side, (wall, cpu) in per.items():
        print(f"{side:7} wall {wall:6.2f} s  cpu {cpu:6.2f} s  per exec: {wall / args.n * 1000:5.1f} ms wall")
    (wall_r, cpu_r), (wall_b, cpu_b) = per["reaped"], per["bare"]
    print(f"ratio reaped/bare: wall {wall_r / wall_b:.2f}x, cpu {cpu_r / cpu_b:.2f}x")


if __name__ == "__main__":
    main()
