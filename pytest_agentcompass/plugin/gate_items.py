"""The gate item: one pytest item per request with ``gates``, judged after the request is finalized.

In the plugin's own loop the item runs after every task, through the
standard protocol. Under xdist the workers cannot know when the other
workers' tasks are done, so they drop their gate items from the run and name
them in ``workeroutput``; the controller finalizes the requests and then
reports each named gate item itself (:func:`report_gate`), before pytest
computes the exit code.

A gate judges the whole request (``reports.gate_basis``), whatever ``-k``,
``-m`` or ``--lf`` selected, and its verdict counts whether or not its item
was selected: :class:`GateJudge` judges each request once per session, and a
missed gate whose item did not run still fails the session.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from .keys import RunHandle, run_key
from .outcomes import ProblemText

if TYPE_CHECKING:
    from _pytest._code.code import ExceptionInfo, TerminalRepr

    from ..config import RunRequest
    from ..reports.gate_basis import GateVerdict
    from ..runtime.request import RequestRuntime

__all__ = ["GATE_NAME", "GateFailed", "GateItem", "GateJudge", "gate_verdict", "report_gate"]

#: The item's name under its request: ``<config>::<request>::gates``.
GATE_NAME = "gates"
#: ``workeroutput`` key naming the gate items a worker dropped (xdist).
WORKER_GATES = "agentcompass_gates"


class GateFailed(Exception):
    """The request missed at least one gate; ``str()`` names each metric, its value and minimum."""


class GateJudge:
    """This session's gate verdicts: each request judged once, by whichever asks first.

    The finalized request records its verdict in its ``summary.json`` (before
    its page is written); the gate item, the terminal summary and the end of
    the session read the same verdict.
    """

    def __init__(self, run: RunHandle) -> None:
        self.run = run
        self.verdicts: dict[str, GateVerdict | None] = {}
        #: Requests whose gate item ran (or was reported by the xdist controller) in this session.
        self.itemized: set[str] = set()

    def verdict(self, req: RunRequest, state: RequestRuntime | None = None) -> GateVerdict | None:
        """The verdict of ``req``'s gates; ``state``: its finalized runtime, if this session ran it."""
        if req.name in self.verdicts:
            return self.verdicts[req.name]
        # Judging reads stored results (the summary, the store): loaded when a gate is judged, not at configuration.
        from ..reports.gate_basis import judge_request
        from ..runtime.context import request_fingerprint, task_fingerprint

        if state is None:
            state = next((s for s in self.run.runtimes if s.name == req.name and s.finalized), None)
        run = self.run
        if state is not None:
            ctx = state.ctx
            benchmark, tasks, outcomes = ctx.benchmark, state.tasks, state.outcomes
            fingerprint, current = ctx.fingerprint, state.store.run_dir
            of_task = ctx.task_fingerprint
        else:  # no task of it ran here (--lf after a missed gate, -k gates): earlier runs only
            setup = run.setups.get(req.name)
            if setup is None:
                return None
            benchmark, tasks, outcomes, current = setup.benchmark, setup.tasks, {}, None
            fingerprint = request_fingerprint(req)

            def of_task(task: Any) -> str:
                return task_fingerprint(fingerprint, task)

        verdict = judge_request(
            req,
            benchmark,
            tasks,
            outcomes,
            request_dir=Path(run.loaded.output_root) / req.name,
            current=current,
            fingerprint=of_task,
            request_fingerprint=fingerprint,
            metrics=state.metrics if state is not None else None,
        )
        self.verdicts[req.name] = verdict
        return verdict

    def record(self, state: RequestRuntime) -> None:
        """Judge a request that was just finalized and add the verdict to its ``summary.json``."""
        req = state.ctx.req
        if not req.gates or state.summary is None:
            return
        verdict = self.verdict(req, state)
        if verdict is None:
            return
        state.summary["gates"] = verdict.to_dict()
        try:
            state.store.write_summary(state.summary)
        except OSError as exc:
            state.notes.append(f"the gates' verdict could not be added to summary.json: {exc}")

    def unjudged_misses(self) -> list[str]:
        """Requests whose gates were missed while their gate item did not run (it was not selected)."""
        missed = (name for name, v in self.verdicts.items() if v is not None and not v.passed)
        return [name for name in missed if name not in self.itemized]


def gate_verdict(run: RunHandle, req: RunRequest) -> tuple[str, str]:
    """``(outcome, message)`` of the gate item: ``passed``, ``failed`` or ``skipped`` (nothing to judge)."""
    judge: GateJudge = run.verdicts.gates
    judge.itemized.add(req.name)
    verdict = judge.verdict(req)
    if verdict is None:
        return "skipped", (
            f"request {req.name!r}: nothing to judge: no task of it ran in this session, "
            "and no earlier run with the same settings recorded a result"
        )
    check = verdict.check
    text = check.message() if not check.passed else "\n".join(check.met)
    return ("passed" if check.passed else "failed"), f"{text}\n({verdict.basis()})"


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
        if isinstance(excinfo.value, GateFailed):  # its first line the short summary's reason, as a task's
            return ProblemText(str(excinfo.value))  # type: ignore[return-value]
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
        report("call", outcome, ProblemText(message) if outcome == "failed" else None)
    report("teardown", "passed")
    hook.pytest_runtest_logfinish(nodeid=nodeid, location=location)
