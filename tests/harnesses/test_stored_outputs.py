"""A huge model answer costs the run directory a bounded size: stored once, cut in the middle, the cut said."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_agentcompass.runtime.store import RunStore
from pytest_agentcompass.vocabulary.types import RunResult

from agent_helpers import detail, run_dir, trajectory, write_agent_config
from openai_server import ScriptedServer, answer, error, scripted_server, tool_call

pytest.importorskip("openai")
RUN = ("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider")
HUGE = "HEAD" + "x" * 3_000_000 + "TAIL"  # three times the default limit of a stored field


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with scripted_server() as running:
        yield running


def size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def test_a_huge_answer_is_stored_once_and_cut_to_the_default_limit(
    pytester: pytest.Pytester, server: ScriptedServer
) -> None:
    server.push(answer(HUGE))
    write_agent_config(pytester, server, harness="openai")
    result = pytester.runpytest(*RUN)
    result.assert_outcomes(failed=1)
    note = "stored with fields cut to 1000000 characters (execution.max_stored_chars): output (3000008 characters)"
    result.stdout.fnmatch_lines([f"note: {note}"])  # the task's report says it

    record = detail(pytester)
    output = record["output"]
    assert output.startswith("HEAD") and output.endswith("TAIL") and len(output) < 1_000_200
    assert "\n[... 2000008 characters not stored: a stored field keeps 1000000" in output
    assert record["truncated_fields"] == {"output": 3_000_008} and note in record["notes"]
    # The attempt's entry does not repeat the task's output.
    attempt = record["attempt_results"]["0"]
    assert "output" not in attempt and attempt["same_as_task"] == ["output", "artifacts", "metadata"]

    saved = trajectory(pytester, record)
    assert saved["truncated_fields"] == {"events[1].message.content": 3_000_008}
    assert saved["events"][1]["message"]["content"] == output
    assert size(run_dir(pytester)) < 2_200_000  # was 3 + 3 + 3 MB


def test_the_limit_is_a_request_setting_and_bounds_every_try(pytester: pytest.Pytester, server: ScriptedServer) -> None:
    server.push(
        tool_call("yes 0123456789 | head -c 5000"),  # a long tool result in the first try's trajectory
        error(500, "upstream failed"),
        answer("A" * 3000),
    )
    write_agent_config(
        pytester,
        server,
        execution={"max_stored_chars": 1000, "max_retries": 1, "retry_pattern_list": ["InternalServerError"]},
    )
    pytester.runpytest(*RUN).assert_outcomes(failed=1)
    record = detail(pytester)
    assert record["truncated_fields"] == {"output": 3000} and len(record["output"]) < 1200
    folder = run_dir(pytester) / "artifacts" / "file-0"
    first = json.loads((folder / "attempt-0" / "trajectory.json").read_text())
    assert first["truncated_fields"] == {"events[3].message.content": len("exit code: 0\nstdout:\n") + 5000}
    assert len(first["events"][3]["message"]["content"]) < 1200
    second = json.loads((folder / "attempt-0-retry-1" / "trajectory.json").read_text())
    assert second["truncated_fields"] == {"events[2].message.content": 3000}  # the answer


def test_retry_details_and_checkpoints_are_bounded(tmp_path: Path) -> None:
    store = RunStore(tmp_path, field_limit=200)
    store.save_retry_detail("t", 0, 1, {"error": "E" * 1000, "payload": {"output": "short"}})
    retried = json.loads((tmp_path / "retry_details/t/attempt-0-retry-1.json").read_text())
    assert retried["truncated_fields"] == {"error": 1000} and len(retried["error"]) < 400
    assert retried["payload"] == {"output": "short"}
    store.save_checkpoint("t", 0, "fp", RunResult("t", output="O" * 1000, score=1.0, metadata={"log": ["L" * 500]}))
    (restored,), ignored = store.load_checkpoints("t", "fp")[0].values(), store.load_checkpoints("t", "fp")[1]
    assert ignored == 0 and restored.score == 1.0
    assert restored.output.startswith("O" * 100) and len(restored.output) < 400
    assert len(restored.metadata["log"][0]) < 400
    checkpoint = json.loads((tmp_path / "checkpoints/t/attempt-0.json").read_text())
    assert checkpoint["truncated_fields"] == {"result.output": 1000, "result.metadata.log[0]": 500}


def test_one_attempt_metadata_is_stored_once_and_a_record_of_many_fields_is_bounded(tmp_path: Path) -> None:
    store = RunStore(tmp_path, field_limit=1000)
    attempt = {"log": "L" * 500, "usage": {"calls": 2}}
    detail = {
        "task_id": "t",
        "output": "x",
        # The task's metadata is the attempt's plus what the runtime adds: stored twice before.
        "metadata": {**attempt, "attempts": {"k": 1, "completed": 1}, "attempt_scores": {"0": 1.0}},
        "attempt_results": {"0": {"task_id": "t", "output": "x", "metadata": attempt}},
        "notes": [],
    }
    store.save_partial_result("t", detail)
    record = json.loads((tmp_path / "details/t.json").read_text())
    assert "metadata" not in record["attempt_results"]["0"]
    assert record["attempt_results"]["0"]["same_as_task"] == ["output", "metadata"]
    # Forty fields of 900 characters, each under the limit: 36,000 characters were kept whole.
    many = {f"field{i}": str(i) * 900 for i in range(40)}
    notes: list[str] = []
    store.save_partial_result("u", {"task_id": "u", "metadata": many, "notes": []}, notes=notes)
    text = (tmp_path / "details/u.json").read_text()
    bounded = json.loads(text)
    assert len(text) < 12_000, len(text)
    assert len(bounded["truncated_fields"]) == 40 and bounded["truncated_fields"]["metadata.field7"] == 900
    assert notes and "a record keeps about 4 x execution.max_stored_chars = 4000" in notes[0]
    assert notes[0] in bounded["notes"]


def test_an_answer_cut_at_the_token_limit_is_said_to_be_truncated(pytester: pytest.Pytester) -> None:
    with scripted_server() as server:
        server.push(answer("hi the", prompt_tokens=1, completion_tokens=5, cut=True))
        write_agent_config(pytester, server, harness="openai")
        pytester.runpytest(*RUN).assert_outcomes(failed=1)
    record = detail(pytester)
    assert record["metadata"]["stop_reason"] == "truncated"
    assert record["metadata"]["answer_cut"] == (
        "the model's answer was truncated at its token limit (finish_reason: length)"
    )
