"""Docker attempts: the plugin against the bare Docker SDK doing the same container work.

Each side runs ``--n`` attempts, ``--concurrency`` at a time, and per attempt
starts a container of the busybox test image (``init``, keepalive command,
``working_dir /work``), runs one ``exec`` of ``true`` in it and removes it
(``force``). The plugin side is ``pytest --agentcompass`` with a harness-free
benchmark whose ``run_task`` makes that exec and whose evaluation reuses the
container (plans, details, reports and the summary included); the bare side
is a Python script on the SDK: ``containers.run`` / ``exec_run`` /
``remove(force=True)``, in a thread pool of ``--concurrency`` when above 1.

``--network disabled`` (the default): every phase of the plan is
``disabled``, and the bare side starts its containers with
``network_mode="none"``. ``--network run``: the run phase has ``full``
network and the other phases none, so the plugin attaches the bridge for the
run and detaches it for the evaluation; the bare side starts its containers
on the bridge (the simplest way to give a command the network), so the ratio
shows what the plan's isolation costs on top.

Both sides are child processes measured with ``wait4`` (wall and CPU of the
whole process tree, from the interpreter's start: pytest's start and the
plugin's imports are in the plugin side). Rounds alternate, so a noisy
neighbour hurts both alike; the engine's own CPU is in neither side. At the
end the script checks that neither side left a container behind (by label).

    python perf/bench_docker.py --n 40 --repeat 5
    python perf/bench_docker.py --n 100 --concurrency 10 --repeat 5

``--calls`` counts instead of timing, in this process: the engine requests and
worker-thread hand-offs of ``--n`` attempts made straight on the provider (open,
the plan's network switches around one exec, close), against ``containers.run``
/ ``exec_run`` / ``remove`` on the SDK. Counts do not move with the machine's
load, which the timings on a shared engine do.

    python perf/bench_docker.py --calls --n 10 [--network run]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import Measurement, measure, plugin_cmd

IMAGE = "agentcompass-busybox:test"

SUITE = """
import dataclasses
from pytest_agentcompass import HarnessFreeBenchmark, RunResult, TaskSpec

class OneExec(HarnessFreeBenchmark):
    evaluation_environment_mode = "reuse"
    def __init__(self, n):
        super().__init__(n=n)
        self.n = n
    def load_tasks(self, req):
        return [TaskSpec(f"t{i}") for i in range(self.n)]
    async def run_task(self, task, prepared, env, req, plan):
        result = await env.exec(["true"])
        return RunResult(task.task_id, output=str(result.exit_code))
    def evaluate(self, task, prepared, result, req, plan, env=None):
        return dataclasses.replace(result, score=float(result.output == "0"))
"""

BARE = r"""
import sys
from concurrent.futures import ThreadPoolExecutor

import docker

image, n, concurrency, network, mark = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
client = docker.from_env()

def attempt(i):
    container = client.containers.run(
        image, ["sleep", "2147483647"], entrypoint=[], detach=True, init=True, working_dir="/work",
        network_mode=network, labels={"agentcompass-bench": mark},
    )
    try:
        code, _ = container.exec_run(["true"])
        return code == 0
    finally:
        container.remove(force=True, v=True)

if concurrency == 1:
    passed = sum(attempt(i) for i in range(n))
else:
    with ThreadPoolExecutor(concurrency) as pool:
        passed = sum(pool.map(attempt, range(n)))
print(f"{passed} passed")
sys.exit(0 if passed == n else 1)
"""


def filesystem(path: Path) -> str:
    """The mount holding ``path`` (type, device, mount point), read from /proc/self/mounts."""
    best = ("?", "?", "/")
    real = str(path.resolve())
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            device, point, kind = line.split()[:3]
            if (real == point or real.startswith(point.rstrip("/") + "/")) and len(point) >= len(best[2]):
                best = (kind, device, point)
    return f"{best[0]} on {best[1]} (mounted at {best[2]})"


def leftovers(label: str) -> list[str]:
    """The containers and volumes (the keepalive's) with ``label``."""
    found = []
    for kind in (["ps", "-aq"], ["volume", "ls", "-q"]):
        out = subprocess.run(["docker", *kind, "--filter", f"label={label}"], capture_output=True, text=True)
        found += out.stdout.split()
    return found


def count_calls(n: int, network: str) -> None:
    """Engine requests and thread hand-offs per attempt, the provider against the bare SDK."""
    import asyncio
    import collections
    import re

    import docker
    import requests

    from pytest_agentcompass import EnvironmentSpec
    from pytest_agentcompass.environments.conformance import make_plan
    from pytest_agentcompass.environments.docker import DockerEnvironment

    calls: collections.Counter[str] = collections.Counter()
    send = requests.Session.send

    def counted(self: requests.Session, request: requests.PreparedRequest, **kwargs: object) -> requests.Response:
        path = re.sub(
            r"/[0-9a-f]{64}|/agentcompass-(keepalive-)?[0-9a-f]+", "/<id>", (request.path_url or "").split("?")[0]
        )
        calls[f"{request.method} {re.sub(r'^/v[0-9.]+', '', path)}"] += 1
        return send(self, request, **kwargs)  # type: ignore[arg-type]

    requests.Session.send = counted  # type: ignore[assignment,method-assign]
    to_thread = asyncio.to_thread
    handoffs = 0

    async def counted_to_thread(func: object, /, *args: object, **kwargs: object) -> object:
        nonlocal handoffs
        handoffs += 1
        return await to_thread(func, *args, **kwargs)  # type: ignore[arg-type]

    asyncio.to_thread = counted_to_thread  # type: ignore[assignment]
    mark = uuid.uuid4().hex
    run = "disabled" if network == "disabled" else "full"
    provider = DockerEnvironment(EnvironmentSpec(id="docker", params={"image": IMAGE}))
    plan = make_plan("disabled", run, "disabled")

    async def attempts() -> None:
        nonlocal handoffs
        await provider.preflight()
        calls.clear()
        handoffs = 0
        for _ in range(n):
            session = await provider.open(provider.build_config(plan, "task", {"agentcompass-bench": mark}))
            await session.set_network_policy(plan.run_network_policy)
            assert (await session.exec(["true"])).exit_code == 0
            await session.set_network_policy(plan.evaluation_network_policy)
            await session.close()
        await provider.aclose()

    asyncio.run(attempts())
    plugin, plugin_handoffs = dict(calls), handoffs
    calls.clear()
    client = docker.from_env()
    for _ in range(n):
        container = client.containers.run(
            IMAGE, ["sleep", "2147483647"], entrypoint=[], detach=True, init=True, working_dir="/work",
            network_mode="none" if network == "disabled" else "bridge", labels={"agentcompass-bench": mark},
        )  # fmt: skip
        container.exec_run(["true"])
        container.remove(force=True, v=True)
    for side, counts in (("plugin", plugin), ("bare SDK", dict(calls))):
        listed = ", ".join(f"{k} {v / n:g}" for k, v in sorted(counts.items()))
        print(f"{side}: {sum(counts.values()) / n:g} engine requests per attempt ({listed})")
    print(f"plugin: {plugin_handoffs / n:g} worker-thread hand-offs per attempt")
    print(f"containers and volumes left behind: {len(leftovers(f'agentcompass-bench={mark}'))}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=40, help="attempts per run")
    parser.add_argument("--concurrency", type=int, default=1, help="attempts at once")
    parser.add_argument("--repeat", type=int, default=5, help="alternating rounds")
    parser.add_argument("--network", choices=("disabled", "run"), default="disabled")
    parser.add_argument("--calls", action="store_true", help="count engine requests and hand-offs instead")
    args = parser.parse_args()
    if args.calls:
        return count_calls(args.n, args.network)
    root = Path(tempfile.mkdtemp(prefix="bench-docker-"))
    mark = uuid.uuid4().hex
    policies = {"baseline": "disabled", "run": "disabled" if args.network == "disabled" else "full"}
    policies["evaluation"] = "disabled"
    try:
        (root / "suite.py").write_text(SUITE)
        (root / "bare.py").write_text(BARE)
        (root / "agentcompass.yaml").write_text(
            f"output_dir: runs\ntask_concurrency: {args.concurrency}\nrequests:\n"
            f"  - name: bench\n    benchmark: {{id: 'suite.py:OneExec', params: {{n: {args.n}}}}}\n"
            f"    environment: {{id: docker, params: {{image: '{IMAGE}'}}, network: {policies}}}\n"
        )
        print(f"run dir and workspaces on: {filesystem(root)}; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
        bare_network = "none" if args.network == "disabled" else "bridge"
        bare_cmd = [sys.executable, "bare.py", IMAGE, str(args.n), str(args.concurrency), bare_network, mark]
        plugin_run = plugin_cmd()
        pairs: list[tuple[Measurement, Measurement]] = []
        for _ in range(args.repeat):
            bare = measure(bare_cmd, root)
            plugin = measure(plugin_run, root)
            for name, run in (("bare SDK", bare), ("agentcompass", plugin)):
                if run.returncode != 0:  # a broken run finishes fast: its time must never pass for a result
                    raise SystemExit(f"{name} run failed (exit {run.returncode}): {run.tail}")
            print(
                f"  bare {bare.seconds:6.2f}s (CPU {bare.cpu_seconds:5.2f}s)  plugin {plugin.seconds:6.2f}s"
                f" (CPU {plugin.cpu_seconds:5.2f}s)  -> {plugin.seconds / bare.seconds:.2f}x"
            )
            pairs.append((bare, plugin))
        ratios = [p.seconds / b.seconds for b, p in pairs]
        bare_wall = statistics.median(b.seconds for b, _ in pairs)
        plugin_wall = statistics.median(p.seconds for _, p in pairs)
        bare_cpu = statistics.median(b.cpu_seconds for b, _ in pairs)
        plugin_cpu = statistics.median(p.cpu_seconds for _, p in pairs)
        print(f"pairwise ratios: {', '.join(f'{r:.2f}' for r in ratios)}")
        print(f"median ratio over {len(ratios)} round(s): {statistics.median(ratios):.2f}x")
        print(
            f"medians: bare {bare_wall:.2f}s, plugin {plugin_wall:.2f}s -> {plugin_wall / bare_wall:.2f}x;"
            f" per attempt bare {bare_wall / args.n * 1000:.0f} ms, plugin {plugin_wall / args.n * 1000:.0f} ms;"
            f" CPU bare {bare_cpu:.2f}s, plugin {plugin_cpu:.2f}s"
        )
        runs = [p.name for p in (root / "runs" / "bench").iterdir()]
        leaked = leftovers(f"agentcompass-bench={mark}") + [c for r in runs for c in leftovers(f"agentcompass.run={r}")]
        print(f"containers and volumes left behind: {len(leaked)}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
