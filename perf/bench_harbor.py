"""Harbor tasks on Docker: the plugin against the bare Docker SDK doing the same container work.

Both sides run ``--n`` copies of a small Harbor task (busybox image, built
once before the rounds, so every round is a cached run), one attempt at a
time (``--concurrency N``: N at once, on both sides), and per attempt do the same container work: create and start a
container from the task image, create ``/logs/*``, copy ``solution/`` in and
run ``solve.sh``, copy ``tests/`` to ``/tests`` and run ``test.sh`` as root in
the WORKDIR, read the reward, copy the log folders out, remove the
container. The plugin side is ``pytest --agentcompass`` with the ``oracle``
harness; the bare side is a plain Python script on the SDK. Rounds alternate,
so a noisy neighbour hurts both sides alike; medians of wall and CPU time
(CPU of the child process: the engine's own work is not in it). On a loaded
engine wall time says little, so both sides also count their requests to the
engine per attempt (``COUNT_CALLS``: every HTTP request the SDK sends, by
kind), which does not depend on the load.

``--base`` takes the task image from another base (the busybox test image by
default, on which the engine's work is nearly free): on a Debian-sized base,
``docker diff`` (the integrity check's, one per attempt) walks the whole root
file system, as overlay2 computes it. ``--bare-integrity`` makes the bare
script also send the integrity check's requests (a process listing as the
container starts; before staging the verifier the diff, an inspect for the
container's environment and a second listing; pause and unpause around
staging ``/tests``; its read-back after the verifier), so the ratio shows the
plugin's own cost beside that of tamper evidence. Each side's machine CPU
(``/proc/stat``: the engine, its shims and the containers included) is printed
per attempt; read it on a quiet machine.

    python perf/bench_harbor.py --n 20 --repeat 5 [--concurrency 10] [--base python:3.12-slim] [--bare-integrity]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import Measurement, describe_filesystem, measure, plugin_cmd

TASK_TOML = """version = "1.0"
[metadata]
category = "bench"
[verifier]
timeout_sec = 60.0
[agent]
timeout_sec = 60.0
"""
BUSYBOX = "agentcompass-busybox:test"
#: The task image: ``{base}``, with a ``bash`` that is BusyBox's ``sh`` when the base has no bash.
DOCKERFILE = "FROM {base}\n{bash}WORKDIR /app\n"
BASH_SHIM = "RUN printf '#!/bin/sh\\nexec /bin/sh \"$@\"\\n' > /bin/bash && chmod 755 /bin/bash\n"
SOLVE = "#!/bin/bash\necho 'Hello, world!' > hello.txt\n"
TEST = """#!/bin/bash
if [ "$(cat /app/hello.txt)" = "Hello, world!" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""

#: Counts the SDK's HTTP requests by kind and writes them to ``$COUNT_CALLS`` at exit; loaded by
#: both sides (``bare.py`` imports it, the plugin run finds it as the rootdir's ``conftest.py``).
COUNT_CALLS = r"""
import atexit, collections, json, os, re
import requests.adapters

_counts = collections.Counter()
_send = requests.adapters.HTTPAdapter.send


def _counting_send(self, request, *args, **kwargs):
    path = re.sub(r"^/v[0-9.]+/", "/", request.path_url.split("?")[0])
    kind = re.sub(r"/(containers|exec|images|networks)/[^/]+", r"/\1/{id}", path)
    _counts[f"{request.method} {kind}"] += 1
    return _send(self, request, *args, **kwargs)


requests.adapters.HTTPAdapter.send = _counting_send
atexit.register(lambda: open(os.environ["COUNT_CALLS"], "w").write(json.dumps(_counts)))
"""

BARE = r"""
import count_calls
import io, sys, tarfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
import docker

tag, root, concurrency, integrity = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
client = docker.from_env(max_pool_size=max(10, concurrency))

def put(container, source, target):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(str(source), arcname=target.strip("/"))
    container.put_archive("/", buf.getvalue())

def run(container, argv, **kw):
    code, out = container.exec_run(argv, user="0", demux=True, **kw)
    return code, out

def attempt(task):
    c = client.containers.create(tag, command=["sleep", "2147483647"], entrypoint=[], detach=True, init=True,
                                 working_dir="/app", labels={"agentcompass-bench": "bare"}, network_mode="bridge")
    try:
        c.start()
        if integrity:  # the plugin notes the runner's own processes as the container starts
            c.top(ps_args="-o pid,ppid,stat,args")
        run(c, ["sh", "-c", "mkdir -p /logs/verifier /logs/agent /logs/artifacts && chmod 777 /logs/*"])
        put(c, task / "solution", "/solution")
        run(c, ["bash", "/solution/solve.sh"])
        if integrity:  # what the plugin asks before staging the verifier (shared mode)
            c.diff()
            client.api.inspect_container(c.id)  # the container's PATH and PYTHONPATH, for the diff's findings
            c.top(ps_args="-o pid,ppid,stat,args")
        run(c, ["sh", "-c", "rm -rf /logs/verifier && mkdir -p /logs/verifier && rm -rf /tests"])
        if integrity:  # the plugin stages /tests with the container's processes paused
            c.pause()
        put(c, task / "tests", "/tests")
        if integrity:
            c.unpause()
        run(c, ["bash", "/tests/test.sh"])
        if integrity:  # ... and after the verifier: whether /tests is still the task's
            b"".join(c.get_archive("/tests")[0])
        chunks, _ = c.get_archive("/logs/verifier/reward.txt")
        with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
            passed = float(tar.extractfile(tar.next()).read()) == 1.0
        for folder in ("/logs/agent", "/logs/artifacts", "/logs/verifier"):
            b"".join(c.get_archive(folder)[0])
        return passed
    finally:
        c.remove(force=True, v=True)

tasks = sorted(p for p in root.iterdir() if (p / "task.toml").is_file())
with ThreadPoolExecutor(concurrency) as pool:
    passed = sum(pool.map(attempt, tasks))
print(f"{passed} passed")
sys.exit(0 if passed == len(tasks) else 1)
"""


def write_tasks(root: Path, n: int, concurrency: int, base: str) -> None:
    marker = uuid.uuid4().hex
    for i in range(n):
        task = root / "tasks" / f"task-{i:03d}"
        for sub in ("environment", "tests", "solution"):
            (task / sub).mkdir(parents=True)
        (task / "task.toml").write_text(TASK_TOML)
        (task / "instruction.md").write_text("Write hello.txt.\n")
        (task / "environment" / "Dockerfile").write_text(
            DOCKERFILE.format(base=base, bash=BASH_SHIM if base == BUSYBOX else "")
        )
        # A context of its own: the first run really builds, and removing the image disturbs nobody.
        (task / "environment" / "bench.txt").write_text(marker)
        (task / "tests" / "test.sh").write_text(TEST)
        (task / "solution" / "solve.sh").write_text(SOLVE)
    (root / "bare.py").write_text(BARE)
    (root / "count_calls.py").write_text(COUNT_CALLS)
    (root / "conftest.py").write_text("import count_calls  # noqa: F401\n")
    (root / "agentcompass.yaml").write_text(
        f"output_dir: runs\ntask_concurrency: {concurrency}\nrequests:\n"
        "  - name: bench\n    benchmark: {id: harbor, params: {path: tasks}}\n"
        "    harness: {id: oracle}\n    environment: {id: docker}\n"
    )


def load_time(root: Path, n: int) -> None:
    """Reading ``n`` task directories (what collection does): nothing is built or hashed."""
    import time

    from pytest_agentcompass import ComponentRef, EnvironmentSpec, RunRequest
    from pytest_agentcompass.benchmarks.harbor import HarborBenchmark

    many = root / "many"
    for i in range(n):
        task = many / f"task-{i:04d}"
        (task / "environment").mkdir(parents=True)
        (task / "task.toml").write_text(TASK_TOML)
        (task / "instruction.md").write_text("Write hello.txt.\n")
    wall, cpu = time.perf_counter(), time.process_time()
    req = RunRequest(name="bench", benchmark=ComponentRef(id="harbor"), environment=EnvironmentSpec(id="docker"))
    tasks = HarborBenchmark(path=str(many)).load_tasks(req)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(f"load_tasks of {len(tasks)} task dirs: {wall * 1000:.0f} ms wall, {cpu * 1000:.0f} ms CPU")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=20, help="tasks per run")
    parser.add_argument("--repeat", type=int, default=5, help="alternating rounds")
    parser.add_argument("--concurrency", type=int, default=1, help="attempts at once, on both sides")
    parser.add_argument("--base", default=BUSYBOX, help="the task image's base (one with bash, unless the default)")
    parser.add_argument(
        "--bare-integrity", action="store_true", help="the bare script also sends the integrity check's requests"
    )
    args = parser.parse_args()
    import docker

    from pytest_agentcompass.environments.docker_images import image_tag

    root = Path(tempfile.mkdtemp(prefix="bench-harbor-"))
    print(f"task directories and run directory on: {describe_filesystem(root)}")
    tag = ""
    try:
        load_time(root, 1000)
        write_tasks(root, args.n, args.concurrency, args.base)
        extra = "with" if args.bare_integrity else "without"
        print(f"task image from {args.base}; the bare side {extra} the integrity check's requests")
        tag = image_tag(docker.from_env(), root / "tasks" / "task-000" / "environment")
        plugin_run = plugin_cmd()
        first = measure(plugin_run, root)  # builds the image: the cold run
        if first.returncode != 0:
            raise SystemExit(f"first plugin run failed: {first.tail}")
        print(f"first run (one image build, {args.n} tasks): {first.seconds:.2f}s, CPU {first.cpu_seconds:.2f}s")
        pairs: list[tuple[Measurement, Measurement]] = []
        integrity = "1" if args.bare_integrity else "0"
        for _ in range(args.repeat):
            os.environ["COUNT_CALLS"] = str(root / "bare-calls.json")
            bare = measure([sys.executable, "bare.py", tag, "tasks", str(args.concurrency), integrity], root)
            os.environ["COUNT_CALLS"] = str(root / "plugin-calls.json")
            plugin = measure(plugin_run, root)
            for name, run in (("bare SDK", bare), ("agentcompass", plugin)):
                if run.returncode != 0:
                    raise SystemExit(f"{name} run failed (exit {run.returncode}): {run.tail}")
            pairs.append((bare, plugin))
        for side in ("bare", "plugin"):  # the last round's (every round makes the same requests)
            calls = json.loads((root / f"{side}-calls.json").read_text())
            shown = ", ".join(f"{k} {v / args.n:g}" for k, v in sorted(calls.items()) if v >= args.n)
            print(f"engine requests per attempt, {side}: {sum(calls.values()) / args.n:g} ({shown})")
        builds = list((root / "runs" / "bench").glob("*/images/*.log"))
        print(f"build logs over all runs: {len(builds)} (1 expected: the cached runs build nothing)")
        ratios = [p.seconds / b.seconds for b, p in pairs]
        bare_wall = statistics.median(b.seconds for b, _ in pairs)
        plugin_wall = statistics.median(p.seconds for _, p in pairs)
        bare_cpu = statistics.median(b.cpu_seconds for b, _ in pairs)
        plugin_cpu = statistics.median(p.cpu_seconds for _, p in pairs)
        bare_machine = statistics.median(b.machine_cpu_seconds for b, _ in pairs) / args.n
        plugin_machine = statistics.median(p.machine_cpu_seconds for _, p in pairs) / args.n
        print(f"pairwise ratios: {', '.join(f'{r:.2f}' for r in ratios)}")
        print(f"median ratio over {len(ratios)} round(s): {statistics.median(ratios):.2f}x")
        print(
            f"medians: bare {bare_wall:.2f}s, plugin (cached run) {plugin_wall:.2f}s -> "
            f"{plugin_wall / bare_wall:.2f}x; per attempt bare {bare_wall / args.n * 1000:.0f} ms, "
            f"plugin {plugin_wall / args.n * 1000:.0f} ms; CPU bare {bare_cpu:.2f}s, plugin {plugin_cpu:.2f}s"
        )
        print(
            f"machine CPU per attempt (engine and containers included): bare {bare_machine * 1000:.0f} ms, "
            f"plugin {plugin_machine * 1000:.0f} ms -> {plugin_machine / max(bare_machine, 1e-9):.2f}x"
        )
    finally:
        if tag:  # the image of this run's own context: nobody else uses it
            subprocess.run(["docker", "rmi", tag], capture_output=True, check=False)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
