"""The quickstart runs on a fresh machine and some of its tasks fail for real."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


@pytest.mark.all_plugins  # as users have them: with whatever else is installed
def test_quickstart_runs_with_honest_outcomes(
    pytester: pytest.Pytester, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # A checkout elsewhere than the folder pytest starts in: the config works from anywhere.
    checkout = tmp_path_factory.mktemp("checkout")
    shutil.copytree(ROOT / "example_suites", checkout / "example_suites")
    result = pytester.runpytest_subprocess(f"--agentcompass={checkout}/example_suites/quickstart/agentcompass.yaml")
    result.assert_outcomes(passed=9, failed=3)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*arithmetic: 12 tasks, 9 passed, 3 failed, 0 errors*", "*mean_score=0.75*"])
    (run_dir,) = (checkout / "example_suites/quickstart/.agentcompass/runs/arithmetic").iterdir()
    assert len(list((run_dir / "details").glob("*.json"))) == 12
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["metrics"]["passed"] == 9
    info = json.loads((run_dir / "run_info.json").read_text())
    assert info["status"] == "completed"
    assert set(info["resolved_execution_plans"]) == {f"arith-{i:03d}" for i in range(12)}
