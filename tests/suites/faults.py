"""For the fault tests: a benchmark written into the pytester folder, and a run that must not end in INTERNALERROR."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import write_config

HEAD = """
import dataclasses, logging
from pytest_agentcompass import HarnessFreeBenchmark, LocalEnvironment, PreflightError, RunResult, TaskSpec
"""


def bench_request(
    pytester: pytest.Pytester,
    body: str,
    cls: str = "B",
    benchmark_params: dict[str, Any] | None = None,
    **request: Any,
) -> dict[str, Any]:
    pytester.makepyfile(bench=HEAD + body)
    benchmark: dict[str, Any] = {"id": f"bench.py:{cls}", **({"params": benchmark_params} if benchmark_params else {})}
    return {"name": "r", "benchmark": benchmark, **request}


def run(pytester: pytest.Pytester, requests: list[dict[str, Any]], *args: str, **top: Any) -> pytest.RunResult:
    write_config(pytester, requests, **top)
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider", *args)
    out = result.stdout.str() + result.stderr.str()
    assert result.ret != pytest.ExitCode.INTERNAL_ERROR and "INTERNALERROR" not in out, out
    return result


def strict_json(path: Path) -> Any:
    def refuse(name: str) -> Any:
        raise ValueError(f"{path} holds {name}, which is not JSON")

    return json.loads(path.read_text(), parse_constant=refuse)


ANSWERS = """
class B(HarnessFreeBenchmark):
    def load_tasks(self, req):
        return [TaskSpec(f"t{i}") for i in range(3)]
    def run_task(self, task, prepared, env, req, plan):
        return RunResult(task.task_id, output="x")
    def evaluate(self, task, prepared, result, req, plan, env=None):
        return dataclasses.replace(result, score=1.0)
"""
