"""Component params are checked as strictly as the config around them; paths follow the config file."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from pytest_agentcompass.config import load_config
from pytest_agentcompass.vocabulary.errors import ConfigError

BENCH = """
import dataclasses
from pytest_agentcompass import HarnessFreeBenchmark, ParamsModel, PreparedTask, RunResult, TaskSpec


class Params(ParamsModel):
    n: int = 2


class Echo(HarnessFreeBenchmark):
    params_model = Params

    def __init__(self, n):
        self.n = n

    def load_tasks(self, req):
        return [TaskSpec(task_id=f"e{i}", question="x", ground_truth="x") for i in range(self.n)]

    def prepare_task(self, task, env, req, plan):
        return PreparedTask(task_id=task.task_id, prompt=task.question)

    async def run_task(self, task, prepared, env, req, plan):
        out = await env.exec(["cat", "seed.txt"], timeout=10)
        return RunResult(task_id=task.task_id, output=out.stdout.strip())

    def evaluate(self, task, prepared, result, req, plan, env=None):
        return dataclasses.replace(result, score=float(result.output == "seed"))
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip())
    return path


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ("{base_dri: /tmp}", "requests[0].environment.params.base_dri: unknown key"),
        ('{output_limit: "lots"}', "requests[0].environment.params.output_limit: Input should be a valid integer"),
        ("{output_limit: 0}", "requests[0].environment.params.output_limit: Input should be greater than 0"),
    ],
)
def test_provider_params_are_validated_with_file_and_line(pytester: pytest.Pytester, params: str, message: str) -> None:
    pytester.makepyfile(bench=BENCH)
    write(
        pytester.path / "agentcompass.yaml",
        f"""
        requests:
          - name: r
            benchmark: {{id: "bench.py:Echo"}}
            environment:
              id: local
              params: {params}
        """,
    )
    result = pytester.runpytest("--agentcompass=agentcompass.yaml")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines([f"*agentcompass.yaml:6: {message.replace('[', '[[]')}*"])
    result.stdout.no_fnmatch_line("*Traceback*")


def test_benchmark_params_model_is_validated(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(bench=BENCH)
    write(
        pytester.path / "agentcompass.yaml",
        """
        requests:
          - name: r
            benchmark:
              id: "bench.py:Echo"
              params:
                n: two
        """,
    )
    result = pytester.runpytest("--agentcompass=agentcompass.yaml")
    result.stdout.fnmatch_lines(["*agentcompass.yaml:6: requests[[]0[]].benchmark.params.n: Input should be a valid*"])


def test_a_key_given_twice_is_an_error(tmp_path: Path) -> None:
    path = write(
        tmp_path / "c.yaml",
        """
        requests:
          - name: r
            benchmark: {id: x}
            execution:
              max_retries: 1
              max_retries: 3
        """,
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert f"{path}:6: requests[0].execution.max_retries: key given twice (first on line 5)" in str(info.value)


def test_paths_are_relative_to_the_config_file(pytester: pytest.Pytester) -> None:
    suite = pytester.path / "suite"
    write(suite / "bench.py", BENCH)
    write(suite / "template" / "seed.txt", "seed")
    write(
        suite / "agentcompass.yaml",
        """
        output_dir: out
        requests:
          - name: r
            benchmark: {id: "bench.py:Echo", params: {n: 2}}
            environment: {id: local, params: {template: template, base_dir: ws}}
        """,
    )
    (suite / "ws").mkdir()
    # Run from the parent folder: every relative path still means "next to the config".
    result = pytester.runpytest("--agentcompass=suite/agentcompass.yaml")
    result.assert_outcomes(passed=2)
    assert len(list((suite / "out" / "r").iterdir())) == 1
    assert list((suite / "ws").iterdir()) == []  # workspaces were made there and removed


def test_configs_written_against_the_rootdir_keep_working(pytester: pytest.Pytester) -> None:
    write(pytester.path / "suite" / "bench.py", BENCH)
    write(pytester.path / "suite" / "template" / "seed.txt", "seed")
    write(
        pytester.path / "suite" / "agentcompass.yaml",
        """
        requests:
          - name: r
            benchmark: {id: "suite/bench.py:Echo"}
            environment: {id: local, params: {template: suite/template}}
        """,
    )
    pytester.runpytest("--agentcompass=suite/agentcompass.yaml").assert_outcomes(passed=2)


def test_loaded_config_resolves_output_root(tmp_path: Path) -> None:
    path = write(tmp_path / "deep" / "c.yaml", "requests: [{name: r, benchmark: {id: x}}]\n")
    assert load_config(path).output_root == tmp_path / "deep" / ".agentcompass/runs"
