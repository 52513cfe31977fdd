"""Baselines and gates through pytest's own reports.

Task outcomes keep their one mapping (``outcomes.phase_problems``); this
plugin only adjusts the *call* report pytest made from it, the way pytest's
own xfail does, so the terminal, junit (xfail is ``<skipped>``), ``--lf``,
xdist and the exit code all see the usual thing:

- failed now, failed in the baseline: **xfailed** ("failed in the baseline too");
- failed now, passed in the baseline: **failed**, the message starts with "regression";
- passed now, failed in the baseline: **XPASS** (not strict), an improvement;
- errors stay errors; tasks the baseline does not know behave as without one,
  except that in a request with ``gates`` a task below the threshold is xfailed.

Under xdist the workers make the reports, so each worker loads the baseline
itself (its absolute path travels in ``workerinput``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pytest

from ..reports.baseline import Baseline, BaselineError, Known, compare, load_baseline, save_baseline, state_of
from .gate_items import GateJudge, drop_gate_items
from .nodes import TaskItem
from .outcomes import ProblemText
from .progress import say_line

if TYPE_CHECKING:
    from ..runtime.request import RequestRuntime
    from ..vocabulary.outcome import TaskOutcome
    from .keys import RunHandle

__all__ = ["Verdicts", "Verdict", "verdict"]

log = logging.getLogger("pytest_agentcompass")


@dataclass(frozen=True)
class Verdict:
    kind: Literal["xfail", "xpass", "regression"]
    reason: str


def verdict(outcome: TaskOutcome, known: Known | None, gated: bool) -> Verdict | None:
    """How a baseline entry (``known``) and gates change the report of ``outcome``."""
    if outcome.result.is_error:
        return None  # errors stay errors
    if outcome.passed:
        if known is not None and known.state != "passed":
            return Verdict("xpass", f"improvement: {known.state} in the baseline, passes now")
        return None
    if known is not None:
        if known.state == "passed":
            return Verdict("regression", "regression: passed in the baseline")
        return Verdict("xfail", "failed in the baseline too" + (" (an error there)" if known.state == "error" else ""))
    if gated:
        return Verdict("xfail", "below the pass threshold; the request is judged by its gates")
    return None


def _change(known: Known | None, outcome: TaskOutcome) -> str:
    if known is None:
        return "new"
    now = state_of(outcome.result.status.value, outcome.passed)
    return compare({"t": known}, {"t": Known(now)}).change_of().get("t", "unchanged")


class Verdicts:
    """Registered with the active run; reads ``--agentcompass-baseline``, ``-save-baseline`` and ``-html``."""

    def __init__(self, run: RunHandle) -> None:
        self.run = run
        config = run.config
        workerinput = getattr(config, "workerinput", None)
        raw = workerinput.get("agentcompass_baseline") if workerinput else config.getoption("agentcompass_baseline")
        self.baseline_path = _absolute(config, raw)
        self.baseline: Baseline | None = None
        if self.baseline_path is not None:
            try:
                self.baseline = load_baseline(self.baseline_path)
            except BaselineError as exc:
                raise pytest.UsageError(f"--agentcompass-baseline: {exc}") from None
        self.save_path = _absolute(config, config.getoption("agentcompass_save_baseline"))
        self.html_path = _absolute(config, config.getoption("agentcompass_html"))
        self.gates = GateJudge(run)

    def known(self, request: str, task_id: str) -> Known | None:
        tasks = self.baseline.request(request) if self.baseline else None
        return tasks.get(task_id) if tasks else None

    # -- reports ------------------------------------------------------------
    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
        if not isinstance(item, TaskItem) or item.outcome is None:
            return (yield)
        known = self.known(item.request_name, item.task.task_id)
        if call.when == "setup" and self.baseline is not None:
            # junit reads properties from the teardown report, which copies the item's.
            item.user_properties.append(("agentcompass.baseline", known.state if known else "new"))
            item.user_properties.append(("agentcompass.change", _change(known, item.outcome)))
        report = yield
        if call.when != "call" or item.config.option.runxfail:
            return report
        found = verdict(item.outcome, known, bool(item.setup_info.req.gates))
        if found is None:
            return report
        if found.kind == "xfail" and report.failed:
            report.outcome = "skipped"
            report.wasxfail = found.reason
        elif found.kind == "xpass" and report.passed:
            report.wasxfail = found.reason
        elif found.kind == "regression" and report.failed and isinstance(report.longrepr, ProblemText | str):
            # First: the regression is the short summary's reason (and junit's message).
            report.longrepr = ProblemText(f"{found.reason}\n{report.longrepr}")
        return report

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        # After every selection (--lf's wrapper filters last, and on finding none of its
        # failures among the items, the gate item dropped, it ran everything) and before
        # xdist's worker sends the controller its item ids.
        if hasattr(session.config, "workerinput"):
            drop_gate_items(session.config, session.items)

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        if self.baseline_path is not None:
            node.workerinput["agentcompass_baseline"] = str(self.baseline_path)

    # -- the end of the session -------------------------------------------------
    def summary_lines(self, state: RequestRuntime) -> list[str]:
        """Baseline changes and gates of one request, for the terminal summary."""
        lines: list[str] = []
        old = self.baseline.request(state.name) if self.baseline else None
        if self.baseline is not None and state.summary is not None:
            if old is None:
                lines.append(f"  baseline: request not in {self.baseline.source}; every task is new")
            else:
                changes = compare(old, _tasks_of(state.summary))
                for label, ids in (
                    ("regressions", changes.regressions),
                    ("improvements", changes.improvements),
                    ("still failing", changes.still_failing),
                    ("new tasks", changes.new),
                ):
                    shown = ", ".join(ids[:10]) + (f" ... and {len(ids) - 10} more" if len(ids) > 10 else "")
                    lines.append(f"  {label}: {len(ids)}" + (f" ({shown})" if ids else ""))
        req = state.ctx.req
        verdict = self.gates.verdict(req, state) if req.gates and state.finalized else None
        if verdict is not None:
            check = verdict.check
            word = "met" if check.passed else "MISSED"
            if verdict.cancelled:  # not a verdict on the whole request: say so first
                word = f"{word} on an interrupted run"
            lines.append(f"  gates: {word} ({verdict.basis()})")
            lines += [f"    missed: {line}" for line in check.missed] + [f"    ok: {line}" for line in check.met]
            if not check.passed and req.name not in self.gates.itemized:
                lines.append("    its gate item did not run (not selected): the session fails all the same")
        return lines

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if hasattr(session.config, "workerinput"):
            return
        finalized = [s for s in self.run.runtimes if s.finalized and s.summary is not None]
        terminal = session.config.pluginmanager.get_plugin("terminalreporter")
        if any(s.unwritten for s in self.run.runtimes):
            _fail_session(session)  # a run directory without its summary is not a result CI should accept
        if self.gates.unjudged_misses():
            _fail_session(session)  # a missed gate never exits 0, selected or not (said in the summary)
        if self.save_path is not None and finalized:
            try:
                path = save_baseline(self.save_path, [s.summary for s in finalized if s.summary is not None])
            except BaselineError as exc:
                _say(terminal, f"agentcompass: {exc}", red=True)
                _fail_session(session)
            else:
                _say(terminal, f"agentcompass: baseline written to {path}")
        if self.html_path is not None:
            from ..reports.html import write_session_report

            try:
                path = write_session_report(self.html_path, [s.store.run_dir for s in finalized], self.baseline)
            except OSError as exc:
                _say(terminal, f"agentcompass: cannot write the HTML report {self.html_path}: {exc}", red=True)
                _fail_session(session)
            else:
                _say(terminal, f"agentcompass: HTML report written to {path}")


def _fail_session(session: pytest.Session) -> None:
    """Make the exit status non-zero for something asked for that did not happen.

    A missed gate fails its item; a baseline that could not be written has
    no item to fail, and with exit status 0 CI would go on without it. A
    status that is already non-zero says more and is kept.
    """
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _tasks_of(summary: dict[str, Any]) -> dict[str, Known]:
    return {
        str(t["task_id"]): Known(state_of(str(t["status"]), bool(t["passed"])), str(t["status"]), t["score"])
        for t in summary.get("tasks", [])
    }


def _absolute(config: pytest.Config, raw: str | None) -> Path | None:
    if not raw:
        return None
    path = Path(raw)
    return path if path.is_absolute() else (config.invocation_params.dir / path).resolve()


def _say(terminal: Any, text: str, **markup: bool) -> None:
    if terminal is not None:
        say_line(terminal, text, **markup)
    else:
        log.warning("%s", text)
