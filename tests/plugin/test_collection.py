"""Collection: node ids, selection, listing, and the plugin staying out of the way."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import pytest_agentcompass

from conftest import TRACING, tracing_request, write_config


def test_node_ids_are_config_request_task(pytester: pytest.Pytester, trace: Path) -> None:
    write_config(pytester, [tracing_request("first", trace, n=2), tracing_request("second", trace, n=1)])
    result = pytester.runpytest("--agentcompass=agentcompass.yaml", "--co", "-q")
    result.stdout.fnmatch_lines(
        [
            "agentcompass.yaml::first::t0",
            "agentcompass.yaml::first::t1",
            "agentcompass.yaml::second::t0",
            "3 tests collected*",
        ]
    )
    assert result.ret == 0
    assert not (pytester.path / "runs").exists(), "--co must not run anything"


def test_a_tasks_location_is_pytests_worked_out_once_per_request(pytester: pytest.Pytester, trace: Path) -> None:
    # TaskItem.location takes the path pytest shows from the request (pytest's own looks it up per
    # item): the same tuple pytest's would give, for a config below the root too.
    (pytester.path / "sub").mkdir()
    write_config(
        pytester, [tracing_request("first", trace, n=3), tracing_request("second", trace, n=2)], name="sub/a.yaml"
    )
    items, _ = pytester.inline_genitems("--agentcompass=sub/a.yaml")
    assert len(items) == 5
    for item in items:
        assert item.location == pytest.Item.location.func(item)  # type: ignore[attr-defined]
        assert item.location[0] == os.path.join("sub", "a.yaml")
    assert items[0].location[2] == "first::t0" and items[4].location[2] == "second::t1"


def test_load_and_select_run_once_per_request(pytester: pytest.Pytester, trace: Path) -> None:
    from tracing import read_trace

    write_config(pytester, [tracing_request("first", trace, n=4)])
    pytester.runpytest("--agentcompass=agentcompass.yaml").assert_outcomes(passed=4)
    events = [e["event"] for e in read_trace(trace)]
    assert events.count("load_tasks") == 1
    assert events.count("select_tasks") == 1


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("t1", ["first::t1", "second::t1"]),  # task id
        ("second", ["second::t0", "second::t1"]),  # request name
        ("beta", ["first::t1", "second::t1"]),  # category
        ("first and alpha", ["first::t0"]),
    ],
)
def test_k_matches_task_request_and_category(
    pytester: pytest.Pytester, trace: Path, expression: str, expected: list[str]
) -> None:
    write_config(pytester, [tracing_request("first", trace, n=2), tracing_request("second", trace, n=2)])
    result = pytester.runpytest("--agentcompass=agentcompass.yaml", "-k", expression, "-v")
    result.assert_outcomes(passed=len(expected))
    for nodeid in expected:  # tasks finish in any order
        result.stdout.fnmatch_lines([f"*{nodeid} PASSED*"])
    result.stdout.fnmatch_lines([f"*{4 - len(expected)} deselected*"])


def test_categories_are_markers(pytester: pytest.Pytester, trace: Path) -> None:
    write_config(pytester, [tracing_request("first", trace, n=4, categories=["multi step", "beta"])])
    result = pytester.runpytest("--agentcompass=agentcompass.yaml", "-m", "multi_step", "--strict-markers")
    result.assert_outcomes(passed=2, deselected=2)


@pytest.mark.all_plugins  # as users have them: with whatever else is installed
def test_no_side_effects_without_the_option(pytester: pytest.Pytester, trace: Path) -> None:
    pytester.makepyfile(test_plain="def test_a():\n    assert True\n")
    write_config(pytester, [tracing_request("first", trace)])
    before = sorted(p.name for p in pytester.path.iterdir())

    def lines(*args: str) -> list[str]:
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)
        result.assert_outcomes(passed=1)
        # Only the plugin list and the timing may differ (and the "=" padding around the timing:
        # "in 9.80s" and "in 10.57s" on a loaded machine are not as wide).
        return [
            re.sub(r"=+", "=", re.sub(r" in [0-9.]+s", "", line))
            for line in result.outlines
            if not line.startswith("plugins:")
        ]

    assert lines() == lines("-p", "no:agentcompass")
    created = {p.name for p in pytester.path.iterdir()} - set(before)
    # pytester's own files, and another installed plugin's cache folder
    assert {n for n in created if not n.startswith(("runpytest-", "stdout", "stderr", ".benchmarks"))} == set()
    assert not trace.exists()


@pytest.mark.all_plugins  # as users have them: with whatever else is installed
def test_no_heavy_imports_without_the_option(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_imports="""
        import sys
        def test_modules():
            loaded = [m for m in sys.modules if m.startswith(("docker", "openai", "pytest_agentcompass.runtime"))]
            assert loaded == []
        """
    )
    pytester.runpytest_subprocess().assert_outcomes(passed=1)


def test_collect_only_imports_no_run_machinery(pytester: pytest.Pytester, trace: Path) -> None:
    """Configuring and collecting load the config, the components and the tasks; what runs tasks
    (Orchestrator, request runtimes, the store's writers, the driver) and the ``model.params``
    schemas of a config without a model load only when used (issue 27: import cost at start)."""
    write_config(pytester, [tracing_request("first", trace, n=2)])
    pytester.makeconftest(
        """
        import sys
        def pytest_collection_finish(session):
            names = ("runtime.orchestrator", "runtime.request", "runtime.runtimes", "runtime.driver",
                     "runtime.store.files", "runtime.store.details", "runtime.summary", "reports.html",
                     "config.model_params")
            loaded = [n for n in names if "pytest_agentcompass." + n in sys.modules]
            print("RUN MACHINERY LOADED:", loaded)
        """
    )
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "--co", "-s")
    result.stdout.fnmatch_lines(["RUN MACHINERY LOADED: []"])
    assert result.ret == 0


#: Imports each named module first in a process that holds none of the package: a child forked
#: from a parent that first loaded what the package imports from elsewhere (pydantic, pytest, the
#: SDKs), so each child pays for the package's own modules only (a fresh interpreter per module
#: took 40 s). The parent learns that list from one child that imported every module.
_FIRST_IMPORTS = """
import importlib, json, os, sys, traceback
names = sys.argv[1:]
ours = lambda m: m == "pytest_agentcompass" or m.startswith("pytest_agentcompass.")
read, write = os.pipe()
if os.fork() == 0:
    before = set(sys.modules)
    try:
        for name in names:
            importlib.import_module(name)
    except BaseException:
        pass  # the children below say which module fails, and how
    os.write(write, json.dumps(sorted(m for m in set(sys.modules) - before if not ours(m))).encode())
    os._exit(0)
os.close(write)
with os.fdopen(read) as fh:
    foreign = json.loads(fh.read() or "[]")
os.wait()
for module in foreign:
    try:
        importlib.import_module(module)
    except BaseException:
        pass  # a child imports it again, and fails there if it must
held = [m for m in sys.modules if ours(m)]
if held:
    sys.exit(f"the parent holds {held}: the children would not import first")
failed = []
for name in names:
    pid = os.fork()
    if pid == 0:
        try:
            importlib.import_module(name)
        except BaseException:
            print(f"--- {name}", file=sys.stderr)
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(1)
        os._exit(0)
    if os.waitpid(pid, 0)[1] != 0:
        failed.append(name)
print(len(names) - len(failed), "imported first")
sys.exit(f"failed: {failed}" if failed else 0)
"""


def test_every_module_imports_first_in_a_fresh_interpreter() -> None:
    """No import cycle hides behind the usual import order (the user-code caller, then ``_compat``, first failed)."""
    package = Path(pytest_agentcompass.__file__).parent
    names = sorted(
        "pytest_agentcompass." + ".".join(path.relative_to(package).with_suffix("").parts)
        for path in package.rglob("*.py")
        if path.name != "__init__.py" and "assets" not in path.parts
    )
    done = subprocess.run([sys.executable, "-c", _FIRST_IMPORTS, *names], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.split() == [str(len(names)), "imported", "first"], done.stdout


def test_option_without_paths_runs_only_the_config(pytester: pytest.Pytester, trace: Path) -> None:
    pytester.makepyfile(test_unit="def test_unit():\n    pass\n")
    write_config(pytester, [tracing_request("first", trace, n=2)])
    result = pytester.runpytest("--agentcompass=agentcompass.yaml", "-v")
    result.assert_outcomes(passed=2)
    assert "test_unit" not in result.stdout.str()


def test_paths_given_are_collected_as_well(pytester: pytest.Pytester, trace: Path) -> None:
    pytester.makepyfile(test_unit="def test_unit():\n    pass\n")
    write_config(pytester, [tracing_request("first", trace, n=2)])
    result = pytester.runpytest("--agentcompass=agentcompass.yaml", "test_unit.py", "-v")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*test_unit.py::test_unit PASSED*"])


def test_ini_key_names_the_config(pytester: pytest.Pytester, trace: Path) -> None:
    write_config(pytester, [tracing_request("first", trace, n=2)])
    pytester.makeini("[pytest]\nagentcompass_config = agentcompass.yaml\n")
    pytester.runpytest().assert_outcomes(passed=2)


def test_duplicate_task_ids_are_a_collection_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        bench="""
        from pytest_agentcompass import HarnessFreeBenchmark, TaskSpec
        class Dup(HarnessFreeBenchmark):
            def load_tasks(self, req):
                return [TaskSpec("a"), TaskSpec("b"), TaskSpec("a")]
        """
    )
    write_config(pytester, [{"name": "dup", "benchmark": {"id": "bench.py:Dup"}}])
    result = pytester.runpytest("--agentcompass=agentcompass.yaml")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*request 'dup': duplicate task id 'a'*"])
    assert "Traceback" not in result.stdout.str()
    assert result.ret == pytest.ExitCode.INTERRUPTED


@pytest.mark.parametrize("bad", ["", "../etc", "a::b", "has space", "x" * 201])
def test_unsafe_task_ids_are_refused(pytester: pytest.Pytester, bad: str) -> None:
    pytester.makepyfile(
        bench=f"""
        from pytest_agentcompass import HarnessFreeBenchmark, TaskSpec
        class Bad(HarnessFreeBenchmark):
            def load_tasks(self, req):
                return [TaskSpec({bad!r})]
        """
    )
    write_config(pytester, [{"name": "bad", "benchmark": {"id": "bench.py:Bad"}}])
    result = pytester.runpytest("--agentcompass=agentcompass.yaml")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*request 'bad': *task*"])


def test_unknown_benchmark_id(pytester: pytest.Pytester) -> None:
    write_config(pytester, [{"name": "r", "benchmark": {"id": "nosuch"}}])
    result = pytester.runpytest("--agentcompass=agentcompass.yaml")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*unknown benchmark id 'nosuch' (requests[[]0[]].benchmark.id)*"])
    assert "Traceback" not in result.stdout.str()


INSTALLED_BENCHMARK = """
from pytest_agentcompass import HarnessFreeBenchmark, RunResult, TaskSpec

class Acme(HarnessFreeBenchmark):
    evaluation_environment_mode = "none"
    def load_tasks(self, req):
        return [TaskSpec("a0"), TaskSpec("a1")]
    async def run_task(self, task, prepared, env, req, plan):
        return RunResult(task.task_id, output="ok")
    async def evaluate(self, task, prepared, result, req, plan, env=None):
        return RunResult(task.task_id, output=result.output, score=1.0)
"""


def install_distribution(site: Path) -> None:
    """A distribution as pip leaves it (a ``dist-info`` with ``entry_points.txt``), found on ``sys.path``."""
    info = site / "acme_agents-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-agents\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[pytest_agentcompass.benchmarks]\nacme = acme_bench:Acme\n\n"
        "[pytest_agentcompass.environments]\nlocal = acme_bench:NotLoaded\n"
    )
    (site / "acme_bench.py").write_text(INSTALLED_BENCHMARK)


def test_installed_components_resolve_through_entry_points(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    install_distribution(site)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    write_config(pytester, [{"name": "r", "benchmark": {"id": "acme"}}])
    # The built-in ``local`` wins over the entry point of the same name (whose target does not exist).
    pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider").assert_outcomes(
        passed=2
    )
    write_config(pytester, [{"name": "r", "benchmark": {"id": "acmee"}}])
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*unknown benchmark id 'acmee'*known benchmark ids: *acme*"])


def test_entry_points_are_read_only_for_an_id_that_is_not_built_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_agentcompass.runtime import registry
    from pytest_agentcompass.vocabulary.errors import ComponentError

    scans: list[int] = []
    real = importlib.metadata.entry_points

    def counted() -> importlib.metadata.EntryPoints:
        scans.append(1)
        return real()

    monkeypatch.setattr(registry, "entry_points", counted)
    components = registry.Registry(tmp_path)
    assert components.resolve("environment", "local").__name__ == "LocalEnvironment"
    assert components.resolve("strategy", "avg") is not None
    assert scans == [], "a built-in id costs no scan of the installed distributions"
    with pytest.raises(ComponentError, match="unknown harness id 'nosuch'"):
        components.resolve("harness", "nosuch")
    components.names("benchmark")
    assert scans == [1], "one scan for every kind, once"


def test_missing_benchmark_file_and_class(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(bench="X = 1\n")
    write_config(
        pytester,
        [
            {"name": "nofile", "benchmark": {"id": "missing.py:B"}},
            {"name": "noclass", "benchmark": {"id": "bench.py:B"}},
            {"name": "notabench", "benchmark": {"id": "bench.py:X"}},
        ],
    )
    result = pytester.runpytest("--agentcompass=agentcompass.yaml")
    result.assert_outcomes(errors=3)
    result.stdout.fnmatch_lines(
        ["*no such file*missing.py*", "*'bench.py' has no attribute 'B'*", "*is not a subclass of BaseBenchmark*"],
        consecutive=False,
    )


SIGNATURES = """
import functools

from pytest_agentcompass import BaseAnalyzer, BaseHarness, HarnessFreeBenchmark, RunResult, TaskSpec


class Base(HarnessFreeBenchmark):
    def load_tasks(self, req):
        return [TaskSpec("t1")]

    async def run_task(self, task, prepared, env, req, plan):
        return RunResult(task.task_id, output="ok")

    async def evaluate(self, task, prepared, result, req, plan, env=None):
        return result


class ShortRun(Base):
    async def run_task(self, task, env):
        return RunResult(task.task_id)


class NoEnv(Base):
    def evaluate(self, task, prepared, result, req, plan):
        return result


class Loose(Base):
    # Other names, *args, **kwargs and an extra defaulted parameter all take the runtime's call.
    async def run_task(self, t, *rest, verbose=False):
        return RunResult(t.task_id, output="ok")

    async def evaluate(self, task, *args, **kwargs):
        return result_with_score(task)


def result_with_score(task):
    return RunResult(task.task_id, output="ok", score=1.0)


def with_client(fn):
    # functools.wraps points back at a function that takes one argument more than the wrapper.
    @functools.wraps(fn)
    async def wrapper(self, *args, **kwargs):
        return await fn(self, "client", *args, **kwargs)

    return wrapper


class Decorated(Loose):
    @with_client
    async def run_task(self, client, task, prepared, env, req, plan):
        return RunResult(task.task_id, output=client)

    @functools.singledispatchmethod
    def select_tasks(self, tasks, req):
        return tasks


class Delegating(BaseHarness):
    # A property whose getter needs what preflight sets: not read when the request is built.
    def preflight(self, req):
        self._agent = self._run

    async def _run(self, session, task, prepared, env, req, plan):
        return RunResult(task.task_id, output="ok")

    @property
    def run(self):
        return self._agent


class Harness(BaseHarness):
    def run(self, session, task):
        return RunResult(task.task_id)


class OnInstance(HarnessFreeBenchmark):
    # run_task set on the instance alone (the class keeps the base's): that is what the runtime calls.
    def __init__(self, short=False):
        super().__init__(short=short)
        self.run_task = self._short if short else self._whole

    def load_tasks(self, req):
        return [TaskSpec("t1")]

    async def evaluate(self, task, prepared, result, req, plan, env=None):
        return result_with_score(task)

    async def _short(self, task, env):
        return RunResult(task.task_id)

    async def _whole(self, task, prepared, env, req, plan):
        return RunResult(task.task_id, output="ok")


class Analyzer(BaseAnalyzer):
    def analyze(self, result):
        return {}
"""


def test_a_lifecycle_method_that_cannot_take_the_runtimes_call_fails_collection(pytester: pytest.Pytester) -> None:
    # Found when the request is built, named with the call it must take: not a TypeError in every task.
    pytester.makepyfile(sigs=SIGNATURES)
    write_config(
        pytester,
        [
            {"name": "short", "benchmark": {"id": "sigs.py:ShortRun"}},
            {"name": "noenv", "benchmark": {"id": "sigs.py:NoEnv"}},
            {"name": "loose", "benchmark": {"id": "sigs.py:Loose"}},
            {"name": "decorated", "benchmark": {"id": "sigs.py:Decorated"}},
            {"name": "delegating", "benchmark": {"id": "sigs.py:Loose"}, "harness": {"id": "sigs.py:Delegating"}},
            {"name": "harness", "benchmark": {"id": "sigs.py:Base"}, "harness": {"id": "sigs.py:Harness"}},
            {"name": "analyzer", "benchmark": {"id": "sigs.py:Base"}, "analyzers": [{"id": "sigs.py:Analyzer"}]},
            {"name": "instance", "benchmark": {"id": "sigs.py:OnInstance", "params": {"short": True}}},
            {"name": "instance_ok", "benchmark": {"id": "sigs.py:OnInstance"}},
        ],
    )
    result = pytester.runpytest("--agentcompass=agentcompass.yaml", "--continue-on-collection-errors")
    result.assert_outcomes(passed=4, errors=5)  # the loose, decorated, delegating and instance_ok ones pass
    result.stdout.fnmatch_lines(
        [
            "*benchmark 'sigs.py:ShortRun' (requests[[]0[]].benchmark.id): ShortRun.run_task(task, env) cannot take"
            " what the runtime passes it, run_task(task, prepared, env, req, plan): too many positional arguments",
            "*benchmark 'sigs.py:NoEnv' (requests[[]1[]].benchmark.id): NoEnv.evaluate(task, prepared, result, req,"
            " plan) cannot take what the runtime passes it, evaluate(task, prepared, result, req, plan, env=env):"
            " got an unexpected keyword argument 'env'",
            "*harness 'sigs.py:Harness' (requests[[]5[]].harness.id): Harness.run(session, task) cannot take*",
            "*analyzer 'sigs.py:Analyzer' (requests[[]6[]].analyzers[[]0[]].id): Analyzer.analyze(result) cannot take"
            " what the runtime passes it, analyze(task, result, req): too many positional arguments",
            "*benchmark 'sigs.py:OnInstance' (requests[[]7[]].benchmark.id): OnInstance.run_task(task, env) cannot"
            " take what the runtime passes it, run_task(task, prepared, env, req, plan): too many positional*",
        ],
        consecutive=False,
    )
    assert "Traceback" not in result.stdout.str()


def test_a_module_that_raises_at_import_is_located(pytester: pytest.Pytester) -> None:
    # The line in the user's module, not a traceback and not json's own frame.
    pytester.makepyfile(
        broken='import os\n\nX = {}["k"]\n',
        deep='import json\n\nSETTINGS = json.loads("{")\n',
        dotted='import os\nraise RuntimeError("boom")\n',
    )
    pytester.syspathinsert()
    write_config(
        pytester,
        [
            {"name": "file", "benchmark": {"id": "broken.py:B"}},
            {"name": "deep", "benchmark": {"id": "deep.py:B"}},
            {"name": "dotted", "benchmark": {"id": "dotted:B"}},
        ],
    )
    result = pytester.runpytest("--agentcompass=agentcompass.yaml")
    result.assert_outcomes(errors=3)
    path = pytester.path
    result.stdout.fnmatch_lines(
        [
            f"cannot import benchmark 'broken.py:B' (requests[[]0[]].benchmark.id): {path}/broken.py:3: KeyError: 'k'",
            f"cannot import benchmark 'deep.py:B' (*): {path}/deep.py:3: JSONDecodeError: *",
            f"cannot import benchmark 'dotted:B' (*): {path}/dotted.py:2: RuntimeError: boom",
        ],
        consecutive=False,
    )
    assert "Traceback" not in result.stdout.str()


def test_harness_none_needs_a_harness_free_benchmark(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        bench="""
        from pytest_agentcompass import BaseBenchmark
        class B(BaseBenchmark):
            def load_tasks(self, req):
                return []
        """
    )
    write_config(pytester, [{"name": "r", "benchmark": {"id": "bench.py:B"}}])
    result = pytester.runpytest("--agentcompass=agentcompass.yaml")
    result.stdout.fnmatch_lines(["*harness.id is 'none' but benchmark 'bench.py:B' is not a HarnessFreeBenchmark*"])


def test_load_tasks_exception_shows_user_frames(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        bench="""
        from pytest_agentcompass import HarnessFreeBenchmark
        class B(HarnessFreeBenchmark):
            def load_tasks(self, req):
                raise FileNotFoundError("dataset.jsonl")
        """
    )
    write_config(pytester, [{"name": "r", "benchmark": {"id": "bench.py:B"}}])
    result = pytester.runpytest("--agentcompass=agentcompass.yaml")
    result.stdout.fnmatch_lines(
        ["*request 'r': loading tasks failed*", "*bench.py*load_tasks*", "*FileNotFoundError: dataset.jsonl*"]
    )
    assert "_pytest" not in result.stdout.str()  # only the user's frames


def test_registered_ids_through_the_hook(pytester: pytest.Pytester, trace: Path) -> None:
    pytester.makeconftest(
        f"""
        import importlib.util
        spec = importlib.util.spec_from_file_location("tracing_mod", {TRACING!r})
        mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
        def pytest_agentcompass_register(registry):
            registry.register("benchmark", "tracing", mod.TracingBenchmark)
        """
    )
    request = tracing_request("r", trace, n=2)
    request["benchmark"]["id"] = "tracing"
    write_config(pytester, [request])
    pytester.runpytest("--agentcompass=agentcompass.yaml").assert_outcomes(passed=2)
