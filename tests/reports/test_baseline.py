"""Baselines through real pytest runs: xfail, regressions, XPASS, errors, exit codes, junit, --lf, -n 2."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from conftest import tracing_request, write_config

RUN = "--agentcompass=agentcompass.yaml"


def reference(pytester: pytest.Pytester, trace: Path) -> Path:
    """The baseline: t0, t3 pass; t1, t2 fail."""
    write_config(pytester, [tracing_request("a", trace, n=4, wrong=["t1", "t2"])])
    result = pytester.runpytest(RUN, "--agentcompass-save-baseline=baseline.json")
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(["agentcompass: baseline written to *baseline.json"])
    return pytester.path / "baseline.json"


def changed(pytester: pytest.Pytester, trace: Path) -> None:
    """Against the baseline: t0 errors, t1 improves, t2 still fails, t3 regresses, t4 is new and passes."""
    write_config(pytester, [tracing_request("a", trace, n=5, wrong=["t2", "t3"], fail={"run": {"t0": -1}})])


def junit_cases(path: Path) -> dict[str, ET.Element]:
    root = ET.parse(path).getroot()
    # classname "agentcompass.yaml.a", name "t2" -> "a::t2"
    return {f"{case.get('classname')}::{case.get('name')}".split(".")[-1]: case for case in root.iter("testcase")}


def props(case: ET.Element) -> dict[str, Any]:
    return {p.get("name"): p.get("value") for p in case.iter("property")}


def test_saved_baseline_is_small_json_per_request_and_task(pytester: pytest.Pytester, trace: Path) -> None:
    data = json.loads(reference(pytester, trace).read_text())
    assert data["format"] == "agentcompass.baseline/1"
    tasks = data["requests"]["a"]["tasks"]
    assert {k: v["state"] for k, v in tasks.items()} == {"t0": "passed", "t1": "failed", "t2": "failed", "t3": "passed"}
    assert tasks["t1"]["score"] == 0.0 and tasks["t0"]["score"] == 1.0


def test_outcome_rules_terminal_junit_and_exit_code(pytester: pytest.Pytester, trace: Path) -> None:
    reference(pytester, trace)
    changed(pytester, trace)
    result = pytester.runpytest(RUN, "--agentcompass-baseline=baseline.json", "-rA", "--junitxml=junit.xml")
    result.assert_outcomes(passed=1, failed=1, errors=1, xfailed=1, xpassed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "*regressions: 2 (t0, t3)",
            "*improvements: 1 (t1)",
            "*still failing: 1 (t2)",
            "*new tasks: 1 (t4)",
        ]
    )
    result.stdout.fnmatch_lines(["*XFAIL*a::t2 - failed in the baseline too*"], consecutive=False)
    result.stdout.fnmatch_lines(["*XPASS*a::t1*improvement: failed in the baseline*"], consecutive=False)
    result.stdout.fnmatch_lines(["*regression: passed in the baseline*", "score 0.0 is below*"], consecutive=False)
    cases = junit_cases(pytester.path / "junit.xml")
    skipped = cases["a::t2"].find("skipped")
    assert skipped is not None and skipped.get("type") == "pytest.xfail"
    assert cases["a::t3"].find("failure") is not None
    assert cases["a::t0"].find("error") is not None, "errors stay errors"
    assert cases["a::t1"].find("failure") is None and cases["a::t1"].find("skipped") is None
    assert props(cases["a::t3"])["agentcompass.change"] == "regression"
    assert props(cases["a::t1"])["agentcompass.change"] == "improvement"
    assert props(cases["a::t4"])["agentcompass.baseline"] == "new"


def test_only_known_failures_exit_zero(pytester: pytest.Pytester, trace: Path) -> None:
    reference(pytester, trace)
    result = pytester.runpytest(RUN, "--agentcompass-baseline=baseline.json")
    result.assert_outcomes(passed=2, xfailed=2)
    assert result.ret == pytest.ExitCode.OK


def test_a_run_directory_serves_as_baseline(pytester: pytest.Pytester, trace: Path) -> None:
    reference(pytester, trace)
    (run_dir,) = (pytester.path / "runs/a").iterdir()
    changed(pytester, trace)
    result = pytester.runpytest(RUN, f"--agentcompass-baseline={run_dir}")
    result.assert_outcomes(passed=1, failed=1, errors=1, xfailed=1, xpassed=1)


def test_runxfail_reports_known_failures_as_failures(pytester: pytest.Pytester, trace: Path) -> None:
    reference(pytester, trace)
    result = pytester.runpytest(RUN, "--agentcompass-baseline=baseline.json", "--runxfail")
    result.assert_outcomes(passed=2, failed=2)


def test_last_failed_keeps_the_rules(pytester: pytest.Pytester, trace: Path) -> None:
    reference(pytester, trace)
    changed(pytester, trace)
    pytester.runpytest(RUN, "--agentcompass-baseline=baseline.json")
    # Only the regression and the error failed: xfailed and XPASS tasks are not "last failed".
    result = pytester.runpytest(RUN, "--agentcompass-baseline=baseline.json", "--lf", "--agentcompass-new-run")
    result.assert_outcomes(failed=1, errors=1, deselected=3)
    result.stdout.fnmatch_lines(["*regression: passed in the baseline*"], consecutive=False)


def test_under_xdist_the_workers_apply_the_baseline(pytester: pytest.Pytester, trace: Path) -> None:
    reference(pytester, trace)
    changed(pytester, trace)
    result = pytester.runpytest_subprocess(
        RUN, "--agentcompass-baseline=baseline.json", "-n", "2", "--junitxml=junit.xml"
    )
    result.assert_outcomes(passed=1, failed=1, errors=1, xfailed=1, xpassed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*regressions: 2 (t0, t3)*"])
    assert junit_cases(pytester.path / "junit.xml")["a::t2"].find("skipped") is not None


def test_xdist_only_known_failures_exit_zero(pytester: pytest.Pytester, trace: Path) -> None:
    reference(pytester, trace)
    result = pytester.runpytest_subprocess(RUN, "--agentcompass-baseline=baseline.json", "-n", "2")
    result.assert_outcomes(passed=2, xfailed=2)
    assert result.ret == pytest.ExitCode.OK


def test_save_baseline_merges_into_the_file(pytester: pytest.Pytester, trace: Path) -> None:
    write_config(pytester, [tracing_request("a", trace, n=2), tracing_request("b", trace, n=2, wrong=["t0"])])
    pytester.runpytest(RUN, "--agentcompass-save-baseline=base.json")
    write_config(pytester, [tracing_request("a", trace, n=2, wrong=["t1"]), tracing_request("b", trace, n=2)])
    pytester.runpytest(RUN, "--agentcompass-save-baseline=base.json", "-k", "a and t1")
    data = json.loads((pytester.path / "base.json").read_text())
    assert set(data["requests"]) == {"a", "b"}
    assert data["requests"]["b"]["tasks"]["t0"]["state"] == "failed", "a request not run keeps its entry"
    assert {k: v["state"] for k, v in data["requests"]["a"]["tasks"].items()} == {"t0": "passed", "t1": "failed"}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "*--agentcompass-baseline: baseline *missing.json: no such file or run directory*"),
        ("{not json", "*--agentcompass-baseline: *missing.json: invalid JSON*"),
        ('{"format": "other"}', "*missing.json: not a baseline file*"),
    ],
)
def test_unusable_baseline_is_one_usage_error(
    pytester: pytest.Pytester, trace: Path, content: str | None, message: str
) -> None:
    write_config(pytester, [tracing_request("a", trace, n=1)])
    if content is not None:
        (pytester.path / "missing.json").write_text(content)
    result = pytester.runpytest(RUN, "--agentcompass-baseline=missing.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])
    assert "Traceback" not in result.stderr.str() + result.stdout.str()


def test_unwritable_baseline_path_is_one_message_keeps_the_results_and_fails_the_run(
    pytester: pytest.Pytester, trace: Path
) -> None:
    # The exit status was 0: CI went green without the baseline it was asked to write.
    write_config(pytester, [tracing_request("a", trace, n=2)])
    (pytester.path / "file").write_text("")
    result = pytester.runpytest_subprocess(RUN, "--agentcompass-save-baseline=file/base.json")
    result.assert_outcomes(passed=2)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["agentcompass: cannot write baseline *file/base.json: File exists"])
    assert "Traceback" not in result.stdout.str()


@pytest.mark.parametrize("content", ["{not json", '{"format": "other"}', "[]"])
def test_saving_over_a_file_that_is_no_baseline_keeps_it_and_fails_the_run(
    pytester: pytest.Pytester, trace: Path, content: str
) -> None:
    # It was replaced in silence: whatever the file held (another request's entries) was lost.
    write_config(pytester, [tracing_request("a", trace, n=2)])
    (pytester.path / "base.json").write_text(content)
    result = pytester.runpytest_subprocess(RUN, "--agentcompass-save-baseline=base.json")
    result.assert_outcomes(passed=2)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        ["agentcompass: *base.json*; not overwritten (move it away or delete it to start over)"]
    )
    assert (pytester.path / "base.json").read_text() == content


def test_saving_into_a_missing_folder_creates_it(pytester: pytest.Pytester, trace: Path) -> None:
    write_config(pytester, [tracing_request("a", trace, n=1)])
    result = pytester.runpytest(RUN, "--agentcompass-save-baseline=ci/baselines/base.json")
    assert result.ret == pytest.ExitCode.OK
    data = json.loads((pytester.path / "ci/baselines/base.json").read_text())
    assert set(data["requests"]["a"]["tasks"]) == {"t0"}


@pytest.mark.parametrize("quiet", ["-q", "-qq"])
def test_messages_start_on_a_line_of_their_own_under_quiet(pytester: pytest.Pytester, trace: Path, quiet: str) -> None:
    # "[100%]agentcompass: baseline written ..." ran onto pytest's progress line.
    write_config(pytester, [tracing_request("a", trace, n=2)])
    result = pytester.runpytest_subprocess(
        RUN, quiet, "--agentcompass-save-baseline=base.json", "--agentcompass-html=page.html"
    )
    assert result.ret == pytest.ExitCode.OK
    lines = result.stdout.lines
    for message in ("agentcompass: baseline written to", "agentcompass: HTML report written to"):
        assert any(line.startswith(message) for line in lines), lines
        assert not any(message in line and not line.startswith(message) for line in lines), lines
