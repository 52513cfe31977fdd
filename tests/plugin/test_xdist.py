"""``-n`` through pytest-xdist: workers run tasks, the controller finalizes from the run directory."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import tracing_request, write_config


def test_tasks_run_on_workers_and_the_controller_summarizes(pytester: pytest.Pytester, trace: Path) -> None:
    write_config(
        pytester,
        [tracing_request("a", trace, n=4, wrong=["t1"]), tracing_request("b", trace, n=2, fail={"run": {"t0": -1}})],
    )
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-n", "2", "--junitxml=j.xml")
    result.assert_outcomes(passed=4, failed=1, errors=1)
    result.stdout.fnmatch_lines(
        ["*a: 4 tasks, 3 passed, 1 failed, 0 errors*", "*b: 2 tasks, 1 passed, 0 failed, 1 errors*"]
    )
    pids = {json.loads(line)["pid"] for line in trace.read_text().splitlines() if '"run_task"' in line}
    assert len(pids) == 2, "both workers ran tasks"
    (run_a,) = (pytester.path / "runs/a").iterdir()
    (run_b,) = (pytester.path / "runs/b").iterdir()
    assert run_a.name == run_b.name, "one run id for every worker"
    summary = json.loads((run_a / "summary.json").read_text())
    assert [t["task_id"] for t in summary["tasks"]] == ["t0", "t1", "t2", "t3"]
    assert summary["metrics"]["passed"] == 3
    assert json.loads((run_a / "run_info.json").read_text())["status"] == "completed"
    props = [p.get("name") for p in ET.parse(pytester.path / "j.xml").getroot().iter("property")]
    assert props.count("agentcompass.status") == 6


def test_plain_tests_and_tasks_together_under_xdist(pytester: pytest.Pytester, trace: Path) -> None:
    pytester.makepyfile(test_unit="def test_unit():\n    pass\n")
    write_config(pytester, [tracing_request("a", trace, n=2)])
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "test_unit.py", "-n", "2")
    result.assert_outcomes(passed=3)
