"""The HTML report's files and the report/compare command line (the page in a browser: test_html_browser.py)."""

from __future__ import annotations

import io
import json
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_agentcompass.reports.cli import main
from pytest_agentcompass.reports.html import render_page

from conftest import tracing_request, write_config, write_run

RUN = "--agentcompass=agentcompass.yaml"
HOSTILE = "</script><script>document.title='owned'</script><!--"


def page_data(page: Path) -> dict[str, Any]:
    text = page.read_text()
    found = re.search(r'<script id="agentcompass-data" type="application/json">(.*?)</script>', text, re.S)
    assert found, "the data block ends at its own closing tag"
    data: dict[str, Any] = json.loads(found.group(1))
    return data


def test_an_unwritable_session_page_is_one_message_and_fails_the_run(pytester: pytest.Pytester, trace: Path) -> None:
    # As for a baseline: with exit status 0, CI would go on without the page it was asked for.
    write_config(pytester, [tracing_request("a", trace, n=2)])
    (pytester.path / "file").write_text("")
    result = pytester.runpytest(RUN, "--agentcompass-html=file/session.html")
    result.assert_outcomes(passed=2)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["agentcompass: cannot write the HTML report *file/session.html: *"])
    assert "Traceback" not in result.stdout.str()


def test_every_run_directory_gets_a_report_and_the_session_one_page(pytester: pytest.Pytester, trace: Path) -> None:
    write_config(pytester, [tracing_request("a", trace, n=3, wrong=["t1"]), tracing_request("b", trace, n=2)])
    result = pytester.runpytest(RUN, "--agentcompass-html=out/session.html")
    result.stdout.fnmatch_lines(["agentcompass: HTML report written to *out/session.html"])
    for request, count in (("a", 3), ("b", 2)):
        (run_dir,) = (pytester.path / "runs" / request).iterdir()
        data = page_data(run_dir / "report.html")
        assert [row[1] for row in data["rows"]] == [f"t{i}" for i in range(count)]
        assert data["details"][0]["detail"] == "details/t0.json", "links are relative to the page"
    session = page_data(pytester.path / "out/session.html")
    assert [r["name"] for r in session["requests"]] == ["a", "b"]
    assert len(session["rows"]) == 5
    assert session["details"][0]["detail"].startswith("../runs/a/")
    text = (pytester.path / "out/session.html").read_text()
    assert "<svg" in text and "pass@1" in text
    assert "http://" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "") and "https://" not in text


def test_report_under_xdist_is_written_by_the_controller(pytester: pytest.Pytester, trace: Path) -> None:
    write_config(pytester, [tracing_request("a", trace, n=4, wrong=["t1"])])
    pytester.runpytest_subprocess(RUN, "-n", "2")
    (run_dir,) = (pytester.path / "runs/a").iterdir()
    written = page_data(run_dir / "report.html")
    assert [row[1] for row in written["rows"]] == ["t0", "t1", "t2", "t3"], "in the summary's task order"
    # The controller hands the page the details it read to finalize: the same page as one read from disk.
    (pytester.path / "again.html").write_text(render_page([run_dir], None, link_base=run_dir, title="again"))
    assert page_data(pytester.path / "again.html") == written


def test_baseline_column_in_the_report(pytester: pytest.Pytester, trace: Path) -> None:
    write_config(pytester, [tracing_request("a", trace, n=3, wrong=["t1"])])
    pytester.runpytest(RUN, "--agentcompass-save-baseline=base.json")
    write_config(pytester, [tracing_request("a", trace, n=3, wrong=["t0"])])
    pytester.runpytest(RUN, "--agentcompass-baseline=base.json", "--agentcompass-html=r.html")
    data = page_data(pytester.path / "r.html")
    assert data["columns"][-1] == "change"
    assert {row[1]: row[-1] for row in data["rows"]} == {"t0": "regression", "t1": "improvement", "t2": "unchanged"}


def test_details_retries_artifacts_and_conversation(tmp_path: Path) -> None:
    trajectory = tmp_path / "trajectory.json"
    trajectory.write_text(
        json.dumps(
            {
                "format": "agentcompass.trajectory/1",
                "events": [
                    {"type": "message", "message": {"role": "user", "content": "fix the bug"}},
                    {
                        "type": "model_call",
                        "message": {
                            "role": "assistant",
                            "content": "looking",
                            "tool_calls": [{"function": {"name": "sh", "arguments": '{"cmd": "ls"}'}}],
                        },
                    },
                    {"type": "tool_result", "message": {"role": "tool", "content": "main.py"}},
                    {"type": "error", "error": "model refused"},
                ],
            }
        )
    )
    run_dir = tmp_path / "runs/r/run1"
    write_run(
        run_dir,
        {
            "ok": {
                "artifacts": {"trajectory": str(trajectory), "note": "inline value"},
                "retries": 2,
                "metadata": {"usage": {"total_tokens": 1234}},
            },
            "bad": {"state": "error", "output": HOSTILE},
            "inline": {"state": "failed", "metadata": {"trajectory": [{"role": "user", "content": "hi"}]}},
        },
    )
    out = io.StringIO()
    assert main(["report", str(run_dir)], out=out) == 0
    page = run_dir / "report.html"
    assert out.getvalue().strip() == f"wrote {page}"
    data = page_data(page)
    by_id = {row[1]: (row, data["details"][i]) for i, row in enumerate(data["rows"])}
    row, detail = by_id["ok"]
    assert row[data["columns"].index("tokens")] == 1234
    assert detail["retries"] == ["attempt 0 retry 1 (inference): flaky 1", "attempt 0 retry 2 (inference): flaky 2"]
    assert detail["artifacts"] == [
        ["trajectory", str(Path("../../../trajectory.json")), ""],
        ["note", None, "inline value"],
    ]
    assert [m[0] for m in detail["conversation"]] == ["user", "assistant", "tool", "error"]
    assert "-> sh(" in detail["conversation"][1][1]
    row, detail = by_id["bad"]
    assert row[data["columns"].index("error")] == "RuntimeError: boom"
    assert detail["output"] == HOSTILE and detail["trace"] == "Traceback: boom"
    assert by_id["inline"][1]["conversation"] == [["user", "hi"]]
    text = page.read_text()
    assert "document.title='owned'" not in text.split('type="application/json">', 1)[0]
    assert text.count("</script>") == 2, "agent output cannot close the data block"
    assert "gates: MISSED" in text and "pass@1 = 0.5 is below the minimum 0.9" in text


def test_large_outputs_are_clipped_to_keep_the_page_small(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs/r/big"
    write_run(run_dir, {f"t{i:03d}": {"output": "x" * 200_000} for i in range(300)})
    assert main(["report", str(run_dir), "-o", str(tmp_path / "page.html")]) == 0
    size = (tmp_path / "page.html").stat().st_size
    assert size < 10_000_000, size  # 300 tasks x 200 kB of output would be 60 MB
    data = page_data(tmp_path / "page.html")
    assert "more characters]" in data["details"][0]["output"]


def test_compare_prints_changes_and_exits_one_on_regressions(tmp_path: Path) -> None:
    old, new = tmp_path / "runs/agent-a/1", tmp_path / "runs/agent-b/2"
    write_run(old, {"t0": {}, "t1": {"state": "failed"}, "t2": {}, "gone": {}}, request="agent-a")
    write_run(new, {"t0": {"state": "error"}, "t1": {}, "t2": {}, "fresh": {}}, request="agent-b")
    out = io.StringIO()
    assert main(["compare", str(old), str(new)], out=out) == 1
    assert out.getvalue().splitlines() == [
        "agent-a -> agent-b: 1 regression(s), 1 improvement(s), 0 still failing, 1 new, 1 missing",
        "  regression: t0 (passed 1 -> error)",
        "  improvement: t1 (failed 0 -> passed 1)",
    ]
    assert main(["compare", str(new), str(new)], out=io.StringIO()) == 0


def test_compare_into_a_reader_that_went_away_ends_quietly(tmp_path: Path) -> None:
    # ``compare OLD NEW | head -1``: the pipe closes before the output is written.
    old, new = tmp_path / "runs/a/1", tmp_path / "runs/b/2"
    write_run(old, {f"t{i}": {} for i in range(50)}, request="a")
    write_run(new, {f"t{i}": {"state": "failed"} for i in range(50)}, request="b")
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest_agentcompass", "compare", str(old), str(new)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before a line is written
    stderr = proc.stderr.read()
    proc.stderr.close()
    assert (proc.wait(timeout=60), stderr) == (128 + signal.SIGPIPE, b"")


def test_command_line_errors_are_one_line_and_exit_two(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest_agentcompass", "compare", str(tmp_path / "nope"), str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == f"error: baseline {tmp_path / 'nope'}: no such file or run directory"
    done = subprocess.run(
        [sys.executable, "-m", "pytest_agentcompass", "report", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert "not a run directory" in done.stderr and "Traceback" not in done.stderr


#: Tasks whose details hold what the page shows: long texts (past any clip), attempts, notes, usage, integrity.
MEMORY_SUITE = """
import dataclasses
from pytest_agentcompass import HarnessFreeBenchmark, RunResult, TaskSpec

class Varied(HarnessFreeBenchmark):
    evaluation_environment_mode = "none"
    def load_tasks(self, req):
        return [TaskSpec(f"t{i}", category="c" if i % 2 else None) for i in range(4)]
    async def run_task(self, task, prepared, env, req, plan):
        i = int(task.task_id[1:])
        metadata = {"usage": {"total_tokens": 7 * i}, "integrity": [{"check": "c", "message": "m"}] if i == 2 else []}
        long = "".join(f"line {n} " for n in range(4000))  # 30,000+ characters: cut on the page
        if i == 3:
            raise RuntimeError("  " + long)  # an error and a trace, both past any clip
        output = long if i == 0 else {"answer": i}
        return RunResult(task.task_id, output=output, metadata=metadata, artifacts={"k": "v"})
    async def evaluate(self, task, prepared, result, req, plan, env=None):
        return dataclasses.replace(result, score=0.25 * int(task.task_id[1:]))
"""


def test_the_run_page_is_built_from_memory_as_the_files_would_give_it(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(varied=MEMORY_SUITE)
    write_config(pytester, [{"name": "a", "benchmark": {"id": "varied.py:Varied"}}])
    # A detail file garbled once its task is reported: the page of the run must not need it.
    pytester.makeconftest(
        """
        def pytest_agentcompass_task_finished(item, outcome):
            if outcome.task.task_id == "t1":
                with open(outcome.detail_path, "w") as fh:
                    fh.write("garbled")
        """
    )
    pytester.runpytest(RUN).assert_outcomes(failed=3, errors=1)  # scores 0 to 0.5 against a threshold of 1
    (run_dir,) = (pytester.path / "runs/a").iterdir()
    written = page_data(run_dir / "report.html")
    assert [row[1] for row in written["rows"]] == ["t0", "t1", "t2", "t3"], "t1 from memory, not from its file"
    # Everything else as a page read from the files shows it, clipped texts and their lengths included.
    (pytester.path / "again.html").write_text(render_page([run_dir], None, link_base=run_dir, title="again"))
    from_files = page_data(pytester.path / "again.html")
    assert [row[1] for row in from_files["rows"]] == ["t0", "t2", "t3"]
    del written["rows"][1], written["details"][1]
    assert from_files == written
    assert all("more characters]" in text for text in (written["details"][0]["output"], written["details"][2]["error"]))
    assert written["rows"][2][3] == "error" and written["rows"][1][8] == 14, "t3's state, t2's tokens"
