"""Shared helpers: write agentcompass configs into a pytester directory."""

from __future__ import annotations

import functools
import importlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_agentcompass.runtime.store import RunStore

# pytester's in-process runs remove every module first imported inside them. The Docker SDK's
# HTTP stack (requests, its cookie jar) first imported by a task of such a run, then removed,
# leaves later clients mixing two copies of it ("You can only merge into CookieJar"): import it
# once here, before any inner run, so every run shares one copy.
for _module in ("http.cookiejar", "requests", "docker"):
    try:
        importlib.import_module(_module)
    except ImportError:  # the docker extra is optional
        pass

SUITES = Path(__file__).parent / "suites"
#: The image the Docker tests run in (``scripts/start-docker.sh`` builds it).
DOCKER_TEST_IMAGE = "agentcompass-busybox:test"
# Suite files are material for the tests (task dirs carry their own test_*.py), not tests.
collect_ignore = ["suites"]
TRACING = f"{SUITES / 'tracing.py'}"
sys.path.insert(0, str(SUITES))

#: Test folders in the order ``-n 2`` hands their tests out: those holding the longest single tests
#: first (a cheat suite's Docker run, an agent install), the many short ones last. In file order
#: the suite ended on one worker's 20-second tests while the other had nothing left to take.
FOLDER_ORDER = (
    "cheats",
    "agents",
    "benchmarks",
    "examples",
    "plugin",
    "runtime",
    "environments",
    "gateway",
    "harnesses",
    "reports",
    "package",
    "config",
    "extensions",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Order the tests by :data:`FOLDER_ORDER` (a stable sort: a folder's own order is kept, and with
    it each module's fixtures)."""
    tests = Path(__file__).parent
    rank = {name: index for index, name in enumerate(FOLDER_ORDER)}

    def folder(item: pytest.Item) -> int:
        try:
            parts = item.path.relative_to(tests).parts
        except ValueError:  # not under tests/
            return len(rank)
        name = parts[0]
        if name not in rank and len(parts) > 1:  # in a folder of tests/ (not a file beside conftest.py)
            raise pytest.UsageError(
                f"tests/{name}/ is not in FOLDER_ORDER (tests/conftest.py): add it where its slowest test belongs"
            )
        return rank.get(name, len(rank))

    items.sort(key=folder)


def tracing_request(
    name: str,
    trace: Path,
    *,
    n: int = 3,
    mode: str = "none",
    harness: bool = False,
    env_params: dict[str, Any] | None = None,
    **bench: Any,
) -> dict[str, Any]:
    """A request of the tracing suite (see ``tests/suites/tracing.py``)."""
    execution = bench.pop("execution", {})
    environment = bench.pop("environment", {})
    request: dict[str, Any] = {
        "name": name,
        "benchmark": {
            "id": f"{TRACING}:{'TracingHarnessBenchmark' if harness else 'TracingBenchmark'}",
            "params": {"trace": str(trace), "n": n, "mode": mode, **bench},
        },
        "harness": {"id": f"{TRACING}:TracingHarness", "params": {"trace": str(trace), **bench}}
        if harness
        else {"id": "none"},
        "environment": {
            "id": f"{TRACING}:TracingEnvironment",
            "params": {"trace": str(trace), **(env_params or {})},
            **environment,
        },
        "execution": {"retry_backoff_seconds": 0, **execution},
    }
    return request


def write_config(
    pytester: pytest.Pytester, requests: list[dict[str, Any]], name: str = "agentcompass.yaml", **top: Any
) -> Path:
    data = {"output_dir": "runs", **top, "requests": requests}
    path = pytester.path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


#: The plugins an inner pytest run loads: this one and xdist, as installed (through their entry points).
INNER_PLUGINS = "-p agentcompass -p xdist -p xdist.looponfail"

#: Seconds an inner pytest under ``-n`` may take: a guard against a hang (a lost permit or
#: message deadlocks these runs), never a measurement.
GUARD = 60


@pytest.fixture(autouse=True)
def _inner_runs_load_only_this_plugin(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Inner pytest runs (pytester, subprocesses, their xdist workers) load this plugin and xdist only.

    Whatever else this machine has installed is not under test, and every inner
    process paid for it: hypothesis' terminal summary alone imports its whole
    package, about as long as the rest of a small run. Tests marked
    ``all_plugins`` keep pytest's autoloading, to show the plugin among others.
    """
    if request.node.get_closest_marker("all_plugins") is None:
        if "pytester" in request.fixturenames:
            request.getfixturevalue("pytester")  # first: it clears PYTEST_ADDOPTS
        monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
        monkeypatch.setenv("PYTEST_ADDOPTS", f"{INNER_PLUGINS} {os.environ.get('PYTEST_ADDOPTS', '')}".strip())


@functools.cache
def docker_has(*images: str) -> bool:
    """Whether a Docker engine answers and has ``images`` (asked once per test process)."""
    try:
        probe = subprocess.run(["docker", "image", "inspect", *images], capture_output=True, check=False)
    except FileNotFoundError:  # no docker CLI
        return False
    return probe.returncode == 0


@pytest.fixture(scope="session")
def docker_engine() -> str:
    """The Docker test image, on an engine that answers; the test is skipped without one."""
    if not docker_has(DOCKER_TEST_IMAGE):
        pytest.skip("no Docker engine with the test image (run scripts/start-docker.sh)")
    return DOCKER_TEST_IMAGE


@pytest.fixture
def trace(pytester: pytest.Pytester) -> Path:
    return pytester.path / "trace.jsonl"


def start_pytest(pytester: pytest.Pytester, *args: str, own_group: bool = False) -> subprocess.Popen[str]:
    """A real ``pytest`` process on the config in ``pytester.path`` (for signals and kills).

    :param own_group: in a process group of its own, so a Ctrl-C (``os.killpg``) reaches all its processes (``-n``).
    """
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", "--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider", *args],
        cwd=pytester.path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        start_new_session=own_group,
        # SIGINT as a terminal's Ctrl-C has it, even if this process ignores it.
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) if own_group else None,
    )


def write_run(run_dir: Path, tasks: dict[str, dict[str, Any]], request: str = "r") -> None:
    """A run directory as the store writes it (``state``: passed, failed or error)."""
    store = RunStore(run_dir)
    rows = []
    for task_id, spec in tasks.items():
        state = spec.get("state", "passed")
        status = "inference_error" if state == "error" else "scored"
        score = None if state == "error" else (1.0 if state == "passed" else 0.0)
        detail = {
            "task_id": task_id,
            "request": request,
            "passed": state == "passed",
            "status": status,
            "score": score,
            "output": spec.get("output", f"out {task_id}"),
            "error": "RuntimeError: boom\nsecond line" if state == "error" else None,
            "trace": "Traceback: boom" if state == "error" else None,
            "artifacts": spec.get("artifacts", {}),
            "metadata": spec.get("metadata", {}),
            "attempts": 1,
            "attempt_results": {"0": {"status": status, "score": score}},
            "retries": spec.get("retries", 0),
            "duration": 1.5,
        }
        store.save_partial_result(task_id, detail)
        for number in range(1, spec.get("retries", 0) + 1):
            store.save_retry_detail(
                task_id,
                0,
                number,
                {"attempt_index": 0, "retry_number": number, "stage": "inference", "error": f"flaky {number}"},
            )
        rows.append({"task_id": task_id, "status": status, "score": score, "passed": state == "passed"})
    store.write_summary(
        {"request": request, "run_id": run_dir.name, "status": "completed", "metrics": {"pass@1": 0.5}, "tasks": rows}
    )
    store.write_run_info(
        {
            "run_id": run_dir.name,
            "request": request,
            "status": "completed",
            "config": {"requests": [{"name": request, "gates": {"pass@1": 0.9}}]},
        }
    )
