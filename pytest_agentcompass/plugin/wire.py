"""Reports on the wire between xdist's processes: what a plain serialization would lose.

A not-run task's report carries two parts (``outcomes.NotRunText``): the
pointer the terminal shows and the reason junit writes. xdist sends a
report's ``str()`` alone, and the controller's terminal would print the
request's reason once per task; the two parts travel under their own key.
A task's problem (``outcomes.ProblemText``) travels as its text under a key
of its own too, so the controller's short summary and junit keep its first
line as the reason.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from .keys import NOT_RUN, PROBLEM
from .outcomes import NotRunText, ProblemText

__all__ = ["pytest_report_from_serializable", "pytest_report_to_serializable"]


@pytest.hookimpl(wrapper=True)
def pytest_report_to_serializable(config: pytest.Config, report: Any) -> Generator[None, Any, Any]:
    """On a worker: a not-run task's report keeps its two parts, a task's problem its text."""
    data = yield
    longrepr = getattr(report, "longrepr", None)
    if isinstance(data, dict) and isinstance(longrepr, NotRunText):
        data[NOT_RUN] = [longrepr.text, longrepr.reason]
    elif isinstance(data, dict) and isinstance(longrepr, ProblemText):
        data[PROBLEM] = longrepr.text
    return data


@pytest.hookimpl(wrapper=True)
def pytest_report_from_serializable(config: pytest.Config, data: Any) -> Generator[None, Any, Any]:
    """On the controller: rebuild what :func:`pytest_report_to_serializable` took apart."""
    parts = data.pop(NOT_RUN, None) if isinstance(data, dict) else None
    problem = data.pop(PROBLEM, None) if isinstance(data, dict) else None
    report = yield
    if parts is not None and report is not None:
        report.longrepr = NotRunText(*parts)
    elif isinstance(problem, str) and report is not None:
        report.longrepr = ProblemText(problem)
    return report
