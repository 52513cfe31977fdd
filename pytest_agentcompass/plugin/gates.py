"""The gate item: one pytest item per request with ``gates``, judged after the request is finalized.

In the plugin's own loop the item runs after every task, through the
standard protocol. Under xdist the workers cannot know when the other
workers' tasks are done, so they drop their gate items from the run and name
them in ``workeroutput``; the controller finalizes the requests and then
reports each named gate item itself (:func:`report_gate`), before pytest
computes the exit code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from ..reports.gates import check_gates
from .keys import RunHandle, run_key

if TYPE_CHECKING:
    from _pytest._code.code import ExceptionInfo, TerminalRepr

    from ..config import RunRequest

__all__ = ["GATE_NAME", "GateFailed", "GateItem", "gate_verdict", "report_gate"]

#: The item's name under its request: ``<config>::<request>::gates``.
GATE_NAME = "gates"
#: ``workeroutput`` key naming the gate items a worker dropped (xdist).
WORKER_GATES = "agentcompass_gates"


class GateFailed(Exception):
    """The request missed at least one gate; ``str()`` names each metric, its value and minimum."""


def gate_verdict(run: RunHandle, req: RunRequest) -> tuple[str, str]:
    """``(outcome, message)``: ``passed``, ``failed`` or ``skipped`` (no task of the request ran)."""
    state = next((s for s in run.runtimes if s.name == req.name and s.finalized), None)
    if state is None:
        return "skipped", f"request {req.name!r}: no task ran in this session, so there is nothing to judge"
    check = check_gates(req.name, req.gates, state.metrics)
    return ("passed" if check.passed else "failed"), check.message() if not check.passed else "\n".join(check.met)


class GateItem(pytest.Item):
    """``<config>::<request>::gates``: passes when every gate of the request is met."""

    def __init__(self, *, req: RunRequest, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.req = req

    @property
    def request_name(self) -> str:
        return self.req.name

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, f"{self.req.name}::{self.name}"

    def runtest(self) -> None:
        outcome, message = gate_verdict(self.config.stash[run_key], self.req)
        if outcome == "skipped":
            pytest.skip(message)
        if outcome == "failed":
            raise GateFailed(message)

    def repr_failure(self, excinfo: ExceptionInfo[BaseException], style: Any = None) -> str | TerminalRepr:
        if isinstance(excinfo.value, GateFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)


def drop_gate_items(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker: remove the selected gate items and name them for the controller."""
    gates = [item for item in items if isinstance(item, GateItem)]
    if not gates:
        return
    items[:] = [item for item in items if not isinstance(item, GateItem)]
    workeroutput: dict[str, Any] = getattr(config, "workeroutput", {})
    workeroutput[WORKER_GATES] = [[g.nodeid, g.location[0], g.req.name] for g in gates]


def report_gate(config: pytest.Config, run: RunHandle, nodeid: str, fspath: str) -> None:
    """Report a gate item on the xdist controller, as a worker would have."""
    from _pytest.reports import TestReport

    request = nodeid.split("::")[-2]
    req = next(r for r in run.orchestration.requests if r.name == request)
    outcome, message = gate_verdict(run, req)
    location = (fspath, None, f"{request}::{nodeid.split('::')[-1]}")
    hook = config.hook
    hook.pytest_runtest_logstart(nodeid=nodeid, location=location)

    def report(when: str, result: str, longrepr: Any = None) -> None:
        hook.pytest_runtest_logreport(
            report=TestReport(nodeid, location, {GATE_NAME: 1, request: 1}, result, longrepr, when)  # type: ignore[arg-type]
        )

    if outcome == "skipped":
        report("setup", "skipped", (fspath, 0, f"Skipped: {message}"))
    else:
        report("setup", "passed")
        report("call", outcome, message if outcome == "failed" else None)
    report("teardown", "passed")
    hook.pytest_runtest_logfinish(nodeid=nodeid, location=location)
