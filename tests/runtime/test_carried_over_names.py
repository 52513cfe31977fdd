"""Results taken from an earlier run are *carried over*; the names they had before still work until 0.3.0.

``reuse`` stays the evaluation mode's name. The config key ``reuse:`` and the
option ``--agentcompass-reuse`` are read as ``carry_over:`` and
``--agentcompass-carry-over``, with one warning each; run directories written
with the old names are read as before.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_agentcompass.runtime.ownership import SharedRun
from pytest_agentcompass.runtime.store import RunStore

from conftest import tracing_request, write_config
from tracing import read_trace

RUN = "--agentcompass=agentcompass.yaml"


def second_run(pytester: pytest.Pytester) -> Path:
    _, second = sorted(p for p in (pytester.path / "runs" / "r").iterdir() if not p.name.startswith("."))
    return second


def ran(trace: Path) -> list[str]:
    return [e["task"] for e in read_trace(trace) if e["event"] == "run_task"]


def test_the_old_option_carries_over_and_warns_once(pytester: pytest.Pytester, trace: Path) -> None:
    write_config(pytester, [tracing_request("r", trace, n=3, wrong=["t1"])])
    pytester.runpytest(RUN).assert_outcomes(passed=2, failed=1)
    trace.unlink()
    result = pytester.runpytest(RUN, "--agentcompass-reuse=latest")
    result.assert_outcomes(passed=2, failed=1)
    assert ran(trace) == []
    result.stdout.fnmatch_lines(["r: 3 tasks, 2 passed, 1 failed, 0 errors, 3 carried over"])
    warning = "*DeprecationWarning: --agentcompass-reuse is now --agentcompass-carry-over (the same values);*0.3.0"
    result.stdout.fnmatch_lines([warning])
    assert result.stdout.str().count("--agentcompass-reuse is now") == 1


def test_the_old_config_key_carries_over_and_warns_once_with_its_line(pytester: pytest.Pytester, trace: Path) -> None:
    request = tracing_request("r", trace, n=2)
    path = write_config(pytester, [request])
    pytester.runpytest(RUN).assert_outcomes(passed=2)
    trace.unlink()
    write_config(pytester, [{**request, "reuse": "latest"}])
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if text.strip().startswith("reuse:"))
    result = pytester.runpytest_subprocess(RUN, "-n", "2")
    result.assert_outcomes(passed=2)
    assert ran(trace) == []
    said = f"*{path}:{line}: requests[[]0[]].reuse is now carry_over (the same values); the old name stops*"
    result.stdout.fnmatch_lines([said])
    assert result.stdout.str().count("reuse is now carry_over") == 1, "once, not once per xdist worker"
    info = json.loads((second_run(pytester) / "run_info.json").read_text())
    assert info["config"]["requests"][0]["carry_over"] == "latest" and "reuse" not in info["config"]["requests"][0]


def test_old_and_new_names_together_are_one_clear_error(pytester: pytest.Pytester, trace: Path) -> None:
    path = write_config(pytester, [{**tracing_request("r", trace, n=1), "reuse": "latest", "carry_over": "latest"}])
    result = pytester.runpytest(RUN)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{path}:*: requests[[]0[]].reuse: give carry_over only (reuse is its old name)"])
    write_config(pytester, [tracing_request("r", trace, n=1)])
    result = pytester.runpytest(RUN, "--agentcompass-reuse=latest", "--agentcompass-carry-over=latest")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*give --agentcompass-carry-over only (--agentcompass-reuse is its old name)"])


def test_a_run_directory_written_with_the_old_names_is_read(pytester: pytest.Pytester, trace: Path) -> None:
    """Its summary (``reused`` counts) serves as a baseline, its details are carried over."""
    write_config(pytester, [tracing_request("r", trace, n=3, wrong=["t1"])])
    pytester.runpytest(RUN).assert_outcomes(passed=2, failed=1)
    (old,) = (pytester.path / "runs" / "r").iterdir()
    summary = json.loads((old / "summary.json").read_text())
    summary["counts"]["reused"] = summary["counts"].pop("carried_over")
    for task in summary["tasks"]:
        task["reused"] = task.pop("carried_over")
    (old / "summary.json").write_text(json.dumps(summary))
    info = json.loads((old / "run_info.json").read_text())
    info["reused_from"] = info.pop("carried_over_from")
    (old / "run_info.json").write_text(json.dumps(info))
    trace.unlink()
    result = pytester.runpytest(RUN, f"--agentcompass-carry-over={old}", f"--agentcompass-baseline={old}")
    result.assert_outcomes(passed=2, xfailed=1)  # t1 failed in the baseline too
    assert ran(trace) == []


def test_a_worker_reads_the_old_run_info_key(tmp_path: Path) -> None:
    """An xdist worker tells a detail the owner carried over (byte for byte from the source) from one
    this run made, by the source ``run_info.json`` names, under its old key too."""
    source, run = tmp_path / "source", tmp_path / "run"
    for folder in (source, run):
        (folder / "details").mkdir(parents=True)
    (source / "details" / "t0.json").write_text('{"task_id": "t0"}')
    shutil.copy(source / "details" / "t0.json", run / "details" / "t0.json")
    (run / "details" / "t1.json").write_text('{"task_id": "t1"}')
    (run / "run_info.json").write_text(json.dumps({"reused_from": str(source)}))
    request = SimpleNamespace(store=RunStore(run))
    role = SharedRun()
    assert role._carried_over(request, "t0")  # type: ignore[arg-type]
    assert not role._carried_over(request, "t1")  # type: ignore[arg-type]


def test_the_old_attribute_of_an_outcome_warns() -> None:
    from pytest_agentcompass import RunResult, TaskOutcome, TaskSpec

    outcome = TaskOutcome("r", TaskSpec("t"), RunResult("t"), passed=True, carried_over=True)
    with pytest.warns(DeprecationWarning, match=r"TaskOutcome\.reused is now TaskOutcome\.carried_over"):
        assert outcome.reused is True
