"""Live progress: periodic lines off a TTY, nothing with -q, nothing without the option."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_agentcompass.plugin.progress import format_duration

from conftest import tracing_request, write_config


def test_lines_mode_reports_done_running_and_retries(pytester: pytest.Pytester, trace: Path) -> None:
    write_config(
        pytester,
        [tracing_request("r", trace, n=4, sleep={"run": 0.6}, fail={"run": {"t0": 1}}, execution={"max_retries": 1})],
        task_concurrency=2,
    )
    result = pytester.runpytest("--agentcompass=agentcompass.yaml", "--agentcompass-progress-interval=0.2")
    result.assert_outcomes(passed=4)
    lines = [line for line in result.outlines if line.startswith("[agentcompass:")]
    assert len(lines) >= 3
    assert any("running" in line and "r " in line for line in lines)
    assert any("1 retry" in line for line in lines)
    assert any("ETA" in line for line in lines)


def test_quiet_turns_it_off(pytester: pytest.Pytester, trace: Path) -> None:
    write_config(pytester, [tracing_request("r", trace, n=2, sleep={"run": 0.5})])
    result = pytester.runpytest("--agentcompass=agentcompass.yaml", "-q", "--agentcompass-progress-interval=0.1")
    result.assert_outcomes(passed=2)
    assert not [line for line in result.outlines if line.startswith("[agentcompass:")]


@pytest.mark.parametrize(("seconds", "text"), [(5, "5s"), (65, "1m05s"), (3725, "1h02m")])
def test_durations_read_well(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_the_first_line_waits_one_interval(pytester: pytest.Pytester, trace: Path) -> None:
    """Off a TTY a line comes every 30 s: a run shorter than that prints none (not one at its start)."""
    write_config(pytester, [tracing_request("r", trace, n=2, sleep={"run": 2.5})])
    result = pytester.runpytest("--agentcompass=agentcompass.yaml", "--agentcompass-progress=lines")
    result.assert_outcomes(passed=2)
    assert not [line for line in result.outlines if line.startswith("[agentcompass:")], result.outlines
