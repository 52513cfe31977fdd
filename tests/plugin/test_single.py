"""A task item run by pytest's own protocol: another plugin's loop runs the items, one at a time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import tracing_request, write_config
from tracing import read_trace

#: A plugin whose ``pytest_runtestloop`` runs before the agentcompass one and runs every item itself.
OWN_LOOP = """
import json, os, pytest

class OwnLoop:
    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session):
        items = session.items
        for i, item in enumerate(items):
            nextitem = items[i + 1] if i + 1 < len(items) else None
            item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
        return True

def pytest_sessionstart(session):
    session.config.pluginmanager.register(OwnLoop(), "own-loop")

def pytest_agentcompass_task_finished(item, outcome):
    with open("finished.log", "a") as fh:
        fh.write(outcome.task.task_id + "\\n")
"""


def test_tasks_run_one_by_one_under_pytests_own_protocol(pytester: pytest.Pytester, trace: Path) -> None:
    pytester.makeconftest(OWN_LOOP)
    write_config(pytester, [tracing_request("a", trace, n=3, wrong=["t1"])])
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*score 0.0 is below the pass threshold*"])
    assert (pytester.path / "finished.log").read_text().split() == ["t0", "t1", "t2"]
    runs = [e["task"] for e in read_trace(trace) if e["event"] == "run_task"]
    assert runs == ["t0", "t1", "t2"], "in item order"
    (run_dir,) = (pytester.path / "runs/a").iterdir()
    assert sorted(p.stem for p in (run_dir / "details").glob("*.json")) == ["t0", "t1", "t2"]
    # As docs/how-it-works.md says: the run directory is claimed, never opened or finalized.
    assert json.loads((run_dir / "run_info.json").read_text())["status"] == "created"
    assert not (run_dir / "summary.json").exists()
