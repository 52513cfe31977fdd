"""Fixtures, the pytest way to supply things: components from session fixtures, results to tests."""

from __future__ import annotations

import textwrap

import pytest

BENCH = """
import dataclasses
from pytest_agentcompass import HarnessFreeBenchmark, PreparedTask, RunResult, TaskSpec


class Echo(HarnessFreeBenchmark):
    def __init__(self, n=2, word="hi", log=None):
        self.n, self.word, self.log = n, word, log

    def load_tasks(self, req):
        return [TaskSpec(task_id=f"e{i}", question=self.word, ground_truth=self.word) for i in range(self.n)]

    def prepare_task(self, task, env, req, plan):
        return PreparedTask(task_id=task.task_id, prompt=task.question)

    async def run_task(self, task, prepared, env, req, plan):
        if self.log:
            with open(self.log, "a") as fh:
                fh.write(f"run {task.task_id} {self.word}\\n")
        return RunResult(task_id=task.task_id, output=self.word)

    def evaluate(self, task, prepared, result, req, plan, env=None):
        return dataclasses.replace(result, score=float(result.output == task.ground_truth))
"""


def config(benchmark: str, params: str = "{}") -> str:
    return textwrap.dedent(
        f"""
        output_dir: runs
        requests:
          - name: r
            benchmark: {{id: "{benchmark}", params: {params}}}
        """
    )


def test_a_session_fixture_supplies_the_benchmark_and_conftest_overrides_per_directory(
    pytester: pytest.Pytester,
) -> None:
    log = pytester.path / "log.txt"
    pytester.makepyfile(bench=BENCH)
    pytester.makeconftest(
        f"""
        import pytest
        from bench import Echo

        @pytest.fixture(scope="session")
        def my_bench():
            yield Echo(n=2, word="top", log={str(log)!r})
            with open({str(log)!r}, "a") as fh:
                fh.write("teardown top\\n")
        """
    )
    sub = pytester.mkpydir("sub")
    (sub / "conftest.py").write_text(
        textwrap.dedent(
            """
            import pytest
            from bench import Echo

            @pytest.fixture(scope="session")
            def my_bench():
                return Echo  # a class: built with the config's params
            """
        )
    )
    (pytester.path / "agentcompass.yaml").write_text(config("fixture:my_bench"))
    (sub / "agentcompass.yaml").write_text(config("fixture:my_bench", "{n: 3, word: sub}"))

    result = pytester.runpytest("--agentcompass=agentcompass.yaml", "-v")
    result.assert_outcomes(passed=2)
    lines = log.read_text().splitlines()
    assert sorted(lines[:-1]) == ["run e0 top", "run e1 top"]
    assert lines[-1] == "teardown top"  # torn down once, after the tasks ran

    result = pytester.runpytest("--agentcompass=sub/agentcompass.yaml", "-v")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*sub/agentcompass.yaml::r::e2 PASSED*"])


def test_a_fixture_that_is_not_session_scoped_is_one_clear_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(bench=BENCH)
    pytester.makeconftest(
        """
        import pytest
        from bench import Echo

        @pytest.fixture
        def my_bench():
            return Echo()
        """
    )
    (pytester.path / "agentcompass.yaml").write_text(config("fixture:my_bench"))
    result = pytester.runpytest("--agentcompass=agentcompass.yaml")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(
        ["*requests[[]0[]].benchmark.id: fixture 'my_bench' is function-scoped; a component fixture must be session*"]
    )
    result.stdout.no_fnmatch_line("*Traceback*")
    result.stdout.no_fnmatch_line("*INTERNALERROR*")


def test_an_unknown_fixture_is_named(pytester: pytest.Pytester) -> None:
    (pytester.path / "agentcompass.yaml").write_text(config("fixture:nothing_here"))
    result = pytester.runpytest("--agentcompass=agentcompass.yaml")
    result.stdout.fnmatch_lines(["*requests[[]0[]].benchmark.id: no fixture named 'nothing_here' is visible from*"])
    result.stdout.no_fnmatch_line("*INTERNALERROR*")


def test_agentcompass_results_reaches_ordinary_tests_after_the_tasks(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(bench=BENCH)
    (pytester.path / "agentcompass.yaml").write_text(config("bench.py:Echo", "{n: 4}"))
    pytester.makepyfile(
        test_gate="""
        def test_mean_score(agentcompass_results):
            r = agentcompass_results["r"]
            assert r.counts["tasks"] == 4
            assert r.metrics["mean_score"] == 1.0
            assert sorted(r.outcomes) == ["e0", "e1", "e2", "e3"]
            assert all(o.passed for o in r.outcomes.values())
            assert (r.run_dir / "summary.json").is_file()

        def test_plain():
            pass
        """
    )
    result = pytester.runpytest("--agentcompass=agentcompass.yaml", "test_gate.py", "-v")
    result.assert_outcomes(passed=6)
    # Plain tests keep their place; tests that read results come after the tasks.
    result.stdout.fnmatch_lines(
        [
            "*test_gate.py::test_plain PASSED*",
            "*agentcompass.yaml::r::e*PASSED*",
            "*test_gate.py::test_mean_score PASSED*",
        ]
    )


def test_agentcompass_results_is_unknown_without_the_option(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_gate="""
        def test_it(agentcompass_results):
            pass
        """
    )
    result = pytester.runpytest("-p", "agentcompass", "-rs")
    # Without --agentcompass the plugin registers nothing, so the fixture is unknown.
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'agentcompass_results' not found*"])


def test_agentcompass_results_under_xdist_is_an_error_that_points_at_gates(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(bench=BENCH)
    (pytester.path / "agentcompass.yaml").write_text(config("bench.py:Echo", "{n: 2}"))
    pytester.makepyfile(
        test_gate="""
        def test_bar(agentcompass_results):
            pass
        """
    )
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "test_gate.py", "-n", "2")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*agentcompass_results is not available under xdist (-n)*gates:*"])
