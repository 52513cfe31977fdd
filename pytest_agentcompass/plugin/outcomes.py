"""Task outcomes -> pytest reports.

The mapping is one function (:func:`phase_problems`): an environment,
inference or evaluation error is a failed *setup* (junit ``<error>``), a
valid score below the threshold is a failed *call* (``<failure>``), and a
cleanup problem or a detail record the disk refused is a failed *teardown*
that leaves the task's own result standing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import pytest

from ..runtime.integrity import findings, summarize
from ..vocabulary.outcome import TaskOutcome
from ..vocabulary.types import RunStatus

if TYPE_CHECKING:
    from _pytest.reports import TestReport
    from pluggy import HookRelay

    from ..vocabulary.redact import Redactor

__all__ = [
    "NotRunText",
    "ProblemText",
    "TaskCleanupError",
    "TaskError",
    "TaskFailed",
    "TaskNotRun",
    "TaskProblem",
    "TaskStorageError",
    "emit_reports",
    "phase_problems",
    "redact_longrepr",
    "redact_report",
    "shown",
]

When = Literal["setup", "call", "teardown"]

#: Characters of one piece of text (an error, a trace, captured output) a report shows.
#: A benchmark's 10 MB exception message would otherwise fill the terminal and every junit
#: ``<error>``; the detail file keeps the text up to ``execution.max_stored_chars``.
SHOWN_CHARS = 10_000


class TaskProblem(Exception):
    """A task outcome that pytest should show as a failed phase; ``str()`` is the full text."""


class TaskError(TaskProblem):
    """The task could not be scored (setup phase)."""


class TaskNotRun(TaskError):
    """Its request failed before running anything; ``reason`` is why (shown once in the summary)."""

    def __init__(self, text: str, reason: str) -> None:
        super().__init__(text)
        self.reason = reason


@dataclass(frozen=True)
class _Crash:
    """What pytest reads of a longrepr's ``reprcrash``: the short summary's reason and junit's ``message``."""

    message: str

    def __str__(self) -> str:  # what ``--tb=line`` prints
        return self.message


#: Characters of a problem's first line kept as its one-line reason (junit's ``message``, the short summary).
_REASON_CHARS = 500


def _first_line(text: str) -> str:
    line = text.split("\n", 1)[0]
    return line if len(line) <= _REASON_CHARS else line[:_REASON_CHARS] + "..."


class ProblemText:
    """The longrepr of a task's problem (a failed score, an error, a cleanup fault): its text as it is.

    pytest asks for a ``TerminalRepr``; the first line, the problem itself,
    is also what the short summary prints after the node id and what junit
    writes as the ``message`` of the ``<failure>`` or ``<error>`` (its text
    holds the whole).
    """

    def __init__(self, text: str) -> None:
        self.text = text

    @property
    def reprcrash(self) -> _Crash:
        return _Crash(_first_line(self.text))

    def __str__(self) -> str:
        return self.text

    def __eq__(self, other: object) -> bool:  # xdist drops a collection error a second worker repeats
        return isinstance(other, ProblemText) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    def toterminal(self, tw: Any) -> None:
        for line in self.text.splitlines():
            tw.line(line)


class NotRunText:
    """The longrepr of a :class:`TaskNotRun`: the terminal shows the pointer, ``str()`` the reason too.

    The terminal prints the reason once, in the agentcompass summary, not once
    per task; junit writes ``str(longrepr)`` into each ``<error>`` (message and
    text), where a reader of one test case has no summary to look at. No
    ``reprcrash`` (unlike :class:`ProblemText`): the short summary would print
    the reason again on each task's line.
    """

    def __init__(self, text: str, reason: str) -> None:
        self.text = text
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.text}\nreason: {self.reason}"

    def toterminal(self, tw: Any) -> None:
        for line in self.text.splitlines():
            tw.line(line)


class TaskFailed(TaskProblem):
    """The task was scored below the pass threshold (call phase)."""


class TaskCleanupError(TaskProblem):
    """Cleanup failed after the task finished (teardown phase)."""


class TaskStorageError(TaskProblem):
    """The run directory did not take the task's record (teardown phase; the result is kept)."""


def shown(text: str, limit: int = SHOWN_CHARS, where: str | None = "the detail file") -> str:
    """``text`` as a report shows it: past ``limit`` characters, its head and tail and how much was cut."""
    if len(text) <= limit:
        return text
    half = limit // 2
    cut = len(text) - 2 * half
    rest = f"; the full text is in {where}" if where else ""
    marker = f"\n[... {cut} characters not shown (a report shows {limit}){rest} ...]\n"
    return text[:half] + marker + text[len(text) - half :]


def _clip(value: object, limit: int) -> str:
    text = repr(value)  # quotes make stray whitespace visible
    return text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit} more characters]"


def phase_problems(outcome: TaskOutcome, pass_threshold: float) -> dict[When, TaskProblem | None]:
    """The exception each phase should report for ``outcome`` (``None`` = passed)."""
    result = outcome.result
    problems: dict[When, TaskProblem | None] = {"setup": None, "call": None, "teardown": None}
    if result.is_error:
        stage = result.metadata.get("failure_stage")
        where = f" in the {stage} stage" if stage else ""
        lines = [f"{result.status.value}{where}: {shown(str(result.error))}"]
        if outcome.retries:
            lines.append(f"after {outcome.retries} retr{'y' if outcome.retries == 1 else 'ies'}")
        if outcome.trace:
            lines += ["", shown(outcome.trace)]
        text = "\n".join(lines + _footer(outcome))
        reason = outcome.not_run_reason
        problems["setup"] = TaskError(text) if reason is None else TaskNotRun(text, shown(reason))
    elif not outcome.passed:
        lines = [
            f"score {result.score} is below the pass threshold {pass_threshold}",
            f"output:   {_clip(result.output, 500)}",
        ]
        if outcome.task.ground_truth is not None:
            lines.append(f"expected: {_clip(outcome.task.ground_truth, 300)}")
        problems["call"] = TaskFailed("\n".join(lines + _footer(outcome)))
    if outcome.cleanup_errors:
        problems["teardown"] = TaskCleanupError(
            "cleanup failed (the task's own result is kept):\n" + "\n".join(shown(e) for e in outcome.cleanup_errors)
        )
    if outcome.storage_error:
        cleanup = problems["teardown"]
        storage = shown(outcome.storage_error)
        text = storage if cleanup is None else f"{cleanup}\n\n{storage}"
        problems["teardown"] = TaskStorageError(text)
    return problems


def _footer(outcome: TaskOutcome) -> list[str]:
    lines = [f"note: {shown(note)}" for note in outcome.notes]
    found = findings(outcome.result)
    if found and outcome.result.status is not RunStatus.EVALUATION_ERROR:  # strict says it in the error
        lines.append(f"integrity: {summarize(found)}")
    if outcome.carried_over:
        lines.append("carried over from an earlier run")
    elif outcome.resumed:
        lines.append("kept from the interrupted run this one resumes")
    if outcome.detail_path:
        lines.append(f"detail: {outcome.detail_path}")
    return lines


#: Property pairs many tasks share (``("agentcompass.status", "scored")``), one tuple each: every
#: item keeps its properties to the end of the session (issue 27: memory per task).
_SHARED_PAIRS: dict[tuple[str, type, Any], tuple[str, Any]] = {}
_MAX_SHARED_PAIRS = 4096


def _pair(name: str, value: Any) -> tuple[str, Any]:
    key = (name, type(value), value)  # the type too: 1, 1.0 and True are equal keys
    try:
        pair = _SHARED_PAIRS.get(key)
    except TypeError:  # an unhashable score a benchmark set: its own pair
        return name, value
    if pair is None:
        pair = (name, value)
        if len(_SHARED_PAIRS) < _MAX_SHARED_PAIRS:
            _SHARED_PAIRS[key] = pair
    return pair


def set_properties(item: pytest.Item, outcome: TaskOutcome) -> None:
    """Attach the outcome to ``item.user_properties`` (junit reads them from teardown).

    Brief (the default, ``--agentcompass-properties``): status, score and detail always; attempts,
    retries, carried_over and integrity only where they differ from a first attempt's plain run; the
    request's evaluation mode not at all (``run_info.json`` has it). junit keeps every property of
    every testcase as an XML element to the end of the session: at 10,000 tasks the full eight
    cost more memory than the rest of the plugin's per-task bookkeeping (issue 27)."""
    result = outcome.result
    mine = [
        _pair("agentcompass.status", result.status.value),
        _pair("agentcompass.score", "" if result.score is None else result.score),
    ]
    integrity = _integrity(outcome)
    detail = ("agentcompass.detail", str(outcome.detail_path or ""))
    if getattr(item.config.option, "agentcompass_properties", "brief") == "all":  # the order of old
        mine += [
            _pair("agentcompass.attempts", outcome.attempts),
            _pair("agentcompass.retries", outcome.retries),
            _pair("agentcompass.evaluation_environment_mode", outcome.evaluation_environment_mode),
            _pair("agentcompass.carried_over", outcome.carried_over),
            detail,
            # Empty when nothing was found: what a benchmark saw the agent tamper with otherwise.
            _pair("agentcompass.integrity", integrity),
        ]
    else:
        if outcome.attempts != 1:
            mine.append(_pair("agentcompass.attempts", outcome.attempts))
        if outcome.retries:
            mine.append(_pair("agentcompass.retries", outcome.retries))
        if outcome.carried_over:
            mine.append(_pair("agentcompass.carried_over", True))
        mine.append(detail)
        if integrity:
            mine.append(("agentcompass.integrity", integrity))
    theirs = [(k, v) for k, v in item.user_properties if not str(k).startswith("agentcompass.")]
    item.user_properties[:] = theirs + mine


def _integrity(outcome: TaskOutcome) -> str:
    found = findings(outcome.result)
    return summarize(found, limit=10) if found else ""


def emit_reports(item: pytest.Item, outcome: TaskOutcome, pass_threshold: float) -> None:
    """Replay the standard runtest hooks for a finished task, as xdist's controller does."""
    ihook = item.ihook
    set_properties(item, outcome)
    if outcome.output:
        # Shown by pytest with a failed report (and by -rP), like its own "Captured stdout" sections.
        item.add_report_section("call", "stdout", shown(outcome.output))
    if outcome.logs:
        item.add_report_section("call", "log", shown("\n".join(outcome.logs)))
    found = findings(outcome.result)
    if found:  # shown with the report (-rA, a failure), like captured output: one line per finding
        lines = [f"{f['check']}" + (f" {f['path']}" if f.get("path") else "") + f": {f['message']}" for f in found]
        item.add_report_section("call", "integrity", shown("\n".join(lines)))
    last_turns = outcome.result.metadata.get("last_turns")
    if isinstance(last_turns, str) and last_turns:
        # A model-calling harness's last turns: shown with a failed report, like captured output.
        item.add_report_section("call", "agent turns", shown(last_turns))
    problems = phase_problems(outcome, pass_threshold)
    ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    # An errored task spent its time "in setup": that is where --durations shows it.
    setup = _report(ihook, item, "setup", problems["setup"], outcome.duration if problems["setup"] else 0.0)
    ihook.pytest_runtest_logreport(report=setup)
    if setup.passed:
        ihook.pytest_runtest_logreport(report=_report(ihook, item, "call", problems["call"], outcome.duration))
    ihook.pytest_runtest_logreport(report=_report(ihook, item, "teardown", problems["teardown"], 0.0))
    ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)


def _report(ihook: HookRelay, item: pytest.Item, when: When, problem: TaskProblem | None, seconds: float) -> TestReport:
    # ``ihook``: the item's hook relay, looked up once per task (``item.ihook`` asks the session each time).
    def replay() -> None:
        if problem is not None:
            raise problem

    call = pytest.CallInfo.from_call(replay, when)
    call.duration = seconds
    call.stop = call.start + seconds
    report: TestReport = ihook.pytest_runtest_makereport(item=item, call=call)
    return report


def redact_report(report: TestReport, item: pytest.Item, redactor: Redactor) -> None:
    """Mask ``${VAR}`` values in everything pytest prints or writes for ``report``.

    The failure text, the captured output and log sections (junit's
    ``system-out``/``system-err`` come from them) and the item's properties.
    """
    if not redactor:
        return
    item.user_properties[:] = [(k, redactor.text(v) if isinstance(v, str) else v) for k, v in item.user_properties]
    redact_longrepr(report, redactor)


def redact_longrepr(report: TestReport | pytest.CollectReport, redactor: Redactor) -> None:
    """Mask ``${VAR}`` values in a report's failure text and sections (a collection error's too)."""
    if not redactor:
        return
    if isinstance(report.longrepr, NotRunText):  # masked in its parts: kept short on the terminal
        report.longrepr = NotRunText(redactor.text(report.longrepr.text), redactor.text(report.longrepr.reason))
    elif report.longrepr is not None and not isinstance(report.longrepr, tuple):
        text = str(report.longrepr)
        masked = redactor.text(text)
        if masked != text:
            kept = isinstance(report.longrepr, ProblemText)
            report.longrepr = ProblemText(masked) if kept else masked  # type: ignore[assignment]
    report.sections = [(title, redactor.text(content)) for title, content in report.sections]
