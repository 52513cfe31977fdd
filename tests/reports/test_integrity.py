"""Integrity findings (``RunResult.metadata["integrity"]``) of any benchmark, reported everywhere.

A plain Python benchmark records the findings itself: the detail keeps them,
junit carries ``agentcompass.integrity``, the terminal names each flagged
task and counts them, ``summary.json`` counts them, the HTML page has a
column and a filter; ``execution.integrity: strict`` makes a finding the
task's error.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from conftest import write_config

RUN = ("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider")

#: t1 is flagged in every attempt; t2 only in attempt 1 (when there are several); t0 never.
BENCH = """
import dataclasses
from pytest_agentcompass import HarnessFreeBenchmark, RunResult, TaskSpec

FINDING = {"check": "tool-replaced", "path": "/usr/bin/python3", "message": "changed after the agent ran"}


class Watched(HarnessFreeBenchmark):
    def load_tasks(self, req):
        return [TaskSpec(f"t{i}") for i in range(3)]

    def run_task(self, task, prepared, env, req, plan):
        return RunResult(task.task_id, output="x")

    def evaluate(self, task, prepared, result, req, plan, env=None):
        found = []
        if task.task_id == "t1" or (task.task_id == "t2" and plan.attempt_index == 1):
            found = [FINDING]
        if task.task_id == "t0" and req.name == "malformed":
            found = "someone wrote here"
        metadata = {**result.metadata, "integrity": found} if found else result.metadata
        return dataclasses.replace(result, score=1.0, metadata=metadata)
"""


def watched(pytester: pytest.Pytester, *, name: str = "r", **execution: Any) -> None:
    pytester.makepyfile(watched=BENCH)
    request = {"name": name, "benchmark": {"id": "watched.py:Watched"}, "execution": execution}
    write_config(pytester, [request])


def run_dir(pytester: pytest.Pytester, name: str = "r") -> Path:
    (found,) = (pytester.path / "runs" / name).iterdir()
    return found


def junit_props(path: Path) -> dict[str, dict[str, str]]:
    return {
        str(case.get("name")): {str(p.get("name")): str(p.get("value")) for p in case.iter("property")}
        for case in ET.parse(path).getroot().iter("testcase")
    }


@pytest.mark.parametrize("xdist", [False, True], ids=["in-process", "n2"])
def test_a_finding_flags_its_task_everywhere(pytester: pytest.Pytester, xdist: bool) -> None:
    watched(pytester)
    args = [*RUN, "--junitxml=junit.xml", "--agentcompass-html=page.html", *(["-n", "2"] if xdist else [])]
    result = pytester.runpytest_subprocess(*args)
    result.assert_outcomes(passed=3)  # flag: the scores stand
    result.stdout.fnmatch_lines(
        [
            "r: 3 tasks, 3 passed, 0 failed, 0 errors, 1 integrity-flagged",
            "  integrity: t1: 1 finding(s): tool-replaced /usr/bin/python3: changed after the agent ran",
        ]
    )
    folder = run_dir(pytester)
    detail = json.loads((folder / "details/t1.json").read_text())
    assert detail["metadata"]["integrity"] == [
        {"check": "tool-replaced", "path": "/usr/bin/python3", "message": "changed after the agent ran"}
    ]
    assert json.loads((folder / "summary.json").read_text())["counts"]["integrity_flagged"] == 1
    props = junit_props(pytester.path / "junit.xml")
    expected = "1 finding(s): tool-replaced /usr/bin/python3: changed after the agent ran"
    assert props["t1"]["agentcompass.integrity"] == expected
    assert "agentcompass.integrity" not in props["t0"]  # brief properties: only where something was found
    for page in (pytester.path / "page.html", folder / "report.html"):
        text = page.read_text()
        assert '<th data-col="integrity">' in text and 'id="f-integrity"' in text
        data = json.loads(text.split('type="application/json">', 1)[1].split("</script>", 1)[0])
        counts = {row[1]: row[data["columns"].index("integrity")] for row in data["rows"]}
        assert counts == {"t0": None, "t1": 1, "t2": None}
        (flagged,) = [d for d in data["details"] if d.get("integrity")]
        assert flagged["integrity"] == ["tool-replaced /usr/bin/python3: changed after the agent ran"]


def test_no_findings_no_column(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(watched=BENCH.replace('task.task_id == "t1" or ', "False or ").replace("== 1)", "== 9)"))
    write_config(pytester, [{"name": "r", "benchmark": {"id": "watched.py:Watched"}}])
    result = pytester.runpytest(*RUN, "--agentcompass-html=page.html")
    result.assert_outcomes(passed=3)
    assert "integrity" not in result.stdout.str()
    assert 'data-col="integrity"' not in (pytester.path / "page.html").read_text()


def test_strict_makes_a_finding_the_tasks_error_and_never_retries_it(pytester: pytest.Pytester) -> None:
    # null retries any error (the spec): not this one, which is a verdict on the attempt, not a fault in it.
    watched(pytester, integrity="strict", max_retries=2, retry_backoff_seconds=0)
    result = pytester.runpytest(*RUN, "--junitxml=junit.xml")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(
        ["evaluation_error: integrity (strict): 1 finding(s): tool-replaced /usr/bin/python3: changed after*"]
    )
    detail = json.loads((run_dir(pytester) / "details/t1.json").read_text())
    assert (detail["status"], detail["score"], detail["retries"]) == ("evaluation_error", None, 0)
    assert detail["metadata"]["untrusted_score"] == 1.0 and detail["metadata"]["error_kind"] == "integrity"
    summary = json.loads((run_dir(pytester) / "summary.json").read_text())
    assert summary["metrics"]["mean_score"] == pytest.approx(2 / 3)  # an error counts 0


def test_findings_of_every_attempt_stay_with_the_task(pytester: pytest.Pytester) -> None:
    watched(pytester, attempts={"k": 2, "strategy": "avg"})
    pytester.runpytest(*RUN).assert_outcomes(passed=3)
    detail = json.loads((run_dir(pytester) / "details/t2.json").read_text())
    (finding,) = detail["metadata"]["integrity"]
    assert finding["attempt"] == 1 and finding["check"] == "tool-replaced"
    watched(pytester, attempts={"k": 2, "strategy": "avg"}, integrity="strict")
    result = pytester.runpytest(*RUN)
    result.assert_outcomes(passed=1, errors=2)  # t2 was flagged in one of its attempts: an error too


def test_a_malformed_record_is_a_finding(pytester: pytest.Pytester) -> None:
    watched(pytester, name="malformed")
    result = pytester.runpytest(*RUN)
    result.stdout.fnmatch_lines(["  integrity: t0: 1 finding(s): malformed: metadata.integrity holds 'someone wrote*"])


def test_an_unknown_integrity_mode_is_a_config_error_with_its_line(pytester: pytest.Pytester) -> None:
    watched(pytester, integrity="strictest")
    result = pytester.runpytest(*RUN)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*agentcompass.yaml:*: requests[[]0].execution.integrity: Input should be 'flag' or 'strict'*"]
    )
