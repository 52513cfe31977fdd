"""What the plugin costs at start: the imports ``--agentcompass`` triggers, and whole-process start.

Three kinds of child process, alternated, ``--repeat`` rounds each:

- **import**: ``import pytest`` first (plain pytest pays it too), then times
  what ``pytest_configure`` imports and does when the option is given, by
  stage, wall and CPU, inside the child: the third-party modules it needs
  (pydantic, asyncio, PyYAML: a floor no change of ours moves), the
  plugin's own modules, ``load_config`` of a one-request config, and the
  component registry (target for the plugin's own modules: <= 40 ms, issue 27), the rest of
  what ``pytest_configure`` imports (``register()``: fixtures, verdicts, the loop; the run id), and
  the run's machinery, which loads when the tasks start (Orchestrator, request runtimes, store,
  reports): the cost a real run still pays, only later;
- **plain start** and **active start**: ``pytest --collect-only`` of one plain
  test against ``pytest --agentcompass=<config> --collect-only`` of one task,
  each a whole process measured with ``wait4`` (interpreter start included);
- **inactive start**: the plain collection with the plugin installed but no
  option (it must cost what plain pytest costs).

Usage::

    python perf/bench_import.py --repeat 7
    python -X importtime -c "import pytest; import pytest_agentcompass.plugin.run" 2> imports.txt
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import child_env, describe_filesystem, measure, pytest_cmd, write_plain_suite, write_suite

CHILD = """
import json, sys, time
import importlib
import pytest, _pytest.config
for name in _pytest.config.default_plugins:  # plain pytest pays these too
    importlib.import_module("_pytest." + name)
stages = {}
def stage(name, work):
    wall, cpu = time.perf_counter(), time.process_time()
    work()
    stages[name] = {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}
def third_party():
    import asyncio, yaml
    from pydantic import BaseModel, Field
def ours():
    global load_config, Registry
    from pytest_agentcompass.config import load_config
    from pytest_agentcompass.plugin.run import AgentCompassRun
    from pytest_agentcompass.runtime.registry import Registry
def rest_of_configure():  # what AgentCompassRun.register() and naming the run import
    import pytest_agentcompass.plugin.fixtures, pytest_agentcompass.plugin.verdicts, pytest_agentcompass.plugin.loop
    try:
        import pytest_agentcompass.runtime.store.run_ids
    except ImportError:  # a checkout from before run_ids.py
        import pytest_agentcompass.runtime.store
def run_machinery():  # imported when the tasks start (before the split, at configuration: then ~0 here)
    for name in ("runtime.runtimes", "runtime.driver", "runtime.orchestrator", "reports.terminal", "reports.html"):
        try:
            importlib.import_module("pytest_agentcompass." + name)
        except ImportError:  # runtime.runtimes: a checkout from before the split
            pass
stage("third-party (pydantic, asyncio, yaml)", third_party)
stage("the plugin's own modules", ours)
path = __import__("pathlib").Path(sys.argv[1]).resolve()
stage("load_config", lambda: load_config(path))
stage("Registry()", lambda: Registry(path.parent))
stage("rest of pytest_configure's imports", rest_of_configure)
stage("the run's machinery (at the tasks' start)", run_machinery)
print(json.dumps(stages))
"""

SUITE = """
from pytest_agentcompass import HarnessFreeBenchmark, RunResult, TaskSpec

class One(HarnessFreeBenchmark):
    evaluation_environment_mode = "none"
    def load_tasks(self, req):
        return [TaskSpec("t0")]
    async def run_task(self, task, prepared, env, req, plan):
        return RunResult(task.task_id, output="ok")
    async def evaluate(self, task, prepared, result, req, plan, env=None):
        return result
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        print(f"run directory on: {describe_filesystem(root)}")
        write_suite(root, "one", SUITE, 1, "name: one\nbenchmark: {id: 'one.py:One'}")
        write_plain_suite(root, 1)
        env = child_env()
        # Unmeasured: writes the bytecode caches (and pytest's rewritten modules) every measured run finds.
        measure(pytest_cmd("--agentcompass=agentcompass.yaml", "--collect-only"), root)
        imports: list[dict[str, dict[str, float]]] = []
        starts: dict[str, list[tuple[float, float]]] = {"plain": [], "inactive": [], "active": []}
        for _ in range(args.repeat):
            out = subprocess.run(
                [sys.executable, "-c", CHILD, str(root / "agentcompass.yaml")],
                cwd=root,
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            imports.append(json.loads(out.stdout.strip().splitlines()[-1]))
            for name, cmd in (
                ("plain", pytest_cmd("-p", "no:agentcompass", "--collect-only", "plain")),
                ("inactive", pytest_cmd("--collect-only", "plain")),
                ("active", pytest_cmd("--agentcompass=agentcompass.yaml", "--collect-only")),
            ):
                run = measure(cmd, root)
                if run.returncode != 0:
                    raise SystemExit(f"{name} run failed (exit {run.returncode}): {run.tail}")
                starts[name].append((run.seconds, run.cpu_seconds))
        print("what --agentcompass adds to pytest_configure, by stage (medians):")
        for name in imports[0]:
            wall = statistics.median(i[name]["wall"] for i in imports) * 1000
            cpu = statistics.median(i[name]["cpu"] for i in imports) * 1000
            print(f"  {name:>38}: {wall:4.0f} ms wall, {cpu:4.0f} ms CPU")
        stages = list(imports[0])
        for label, names in (("imports", stages[:2]), ("pytest_configure", stages[:-1]), ("all of it", stages)):
            cpu_totals = [sum(i[n]["cpu"] for n in names) * 1000 for i in imports]
            wall_totals = [sum(i[n]["wall"] for n in names) * 1000 for i in imports]
            each = ", ".join(f"{c:.0f}" for c in cpu_totals)
            print(
                f"  {label:>38}: {statistics.median(wall_totals):4.0f} ms wall,"
                f" {statistics.median(cpu_totals):4.0f} ms CPU (each, CPU ms: {each})"
            )
        for name, runs in starts.items():
            w = statistics.median(r[0] for r in runs)
            c = statistics.median(r[1] for r in runs)
            print(f"{name:>8} pytest --collect-only: median {w * 1000:.0f} ms wall, {c * 1000:.0f} ms CPU")


if __name__ == "__main__":
    main()
