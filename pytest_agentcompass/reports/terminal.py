"""The ``agentcompass`` section of pytest's terminal summary: one block per request."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..concurrency.threads import grouped
from ..models.usage import format_usage
from ..runtime.integrity import summarize
from ..vocabulary.types import OrchestrationStatus

if TYPE_CHECKING:
    from ..runtime.orchestrator import OrchestrationResult
    from ..runtime.summary import RequestSummary

__all__ = ["format_value", "write_terminal_summary"]


#: Errors counted apart in the summary line: (count key, word).
def many(count: int, noun: str, plural: str = "") -> str:
    """``1 task``, ``2 tasks``: counted as pytest's own summary counts (``1 error``)."""
    return f"{count} {noun}" if count == 1 else f"{count} {plural or noun + 's'}"


_ERROR_KINDS = (("environment_errors", "environment"), ("task_errors", "task"))


def format_value(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def write_terminal_summary(
    tr: Any,
    summaries: Sequence[RequestSummary],
    result: OrchestrationResult | None,
    extra: Callable[[RequestSummary], list[str]] | None = None,
    mask: Callable[[str], str] = str,
) -> None:
    """Write counts, metrics, notes and the run directory of each request to ``tr``.

    :param extra: More lines per request (baseline changes, gates).
    :param mask: Applied to every line: a preflight reason or a note may hold a ``${VAR}`` value.
    """
    if not summaries:
        return
    tr.section("agentcompass")
    tr = _Masked(tr, mask)
    for state in summaries:
        counts = state.counts
        line = (
            f"{state.name}: {many(counts['tasks'], 'task')}, {counts['passed']} passed, {counts['failed']} failed, "
            f"{many(counts['errors'], 'error')}"
        )
        kinds = [f"{counts[key]} {word}" for key, word in _ERROR_KINDS if counts.get(key)]
        if kinds:
            line += f" ({', '.join(kinds)})"
        if counts["carried_over"]:
            line += f", {counts['carried_over']} carried over"
        if counts.get("resumed"):
            line += f", {counts['resumed']} resumed"
        if counts["retries"]:
            line += f", {many(counts['retries'], 'retry', 'retries')}"
        if counts.get("integrity_flagged"):
            line += f", {counts['integrity_flagged']} integrity-flagged"
        tr.write_line(line)
        for task_id, found in state.flagged:
            tr.write_line(f"  integrity: {task_id}: {summarize(found)}", yellow=True)
        if state.failed:
            tr.write_line(f"  {state.failed}")
        if state.metrics:
            shown = ", ".join(f"{k}={format_value(v)}" for k, v in state.metrics.items())
            tr.write_line(f"  metrics: {shown}")
        if state.usage:
            tr.write_line(f"  usage: {format_usage(state.usage)}")
        for line in extra(state) if extra else ():
            bad = "MISSED" in line or (line.startswith("  regressions: ") and not line.endswith(": 0"))
            tr.write_line(line, red=bad)
        for note in state.notes:
            tr.write_line(f"  note: {note}")
        tr.write_line(f"  run directory: {state.run_dir}")
    kept = [(state.name, task_id, env) for state in summaries for task_id, env in state.kept_environments]
    if kept:
        tr.write_line("kept environments (keep_environment: true); remove them when done:")
        for name, task_id, env in kept:
            tr.write_line(f"  {name}::{task_id}: {env}")
    if result and result.status in (OrchestrationStatus.TIMEOUT, OrchestrationStatus.INTERRUPTED):
        tr.write_line(f"orchestration {result.status}: {result.reason}", red=True)
    if result and result.abandoned_calls:
        calls = result.abandoned_calls
        tr.write_line(
            f"{len(calls)} blocking call(s) still running after the cleanup grace were abandoned "
            f"(daemon threads, they end with the process): {grouped(calls)}",
            yellow=True,
        )


class _Masked:
    """A terminal reporter whose ``write_line`` masks each line first."""

    def __init__(self, tr: Any, mask: Callable[[str], str]) -> None:
        self._tr, self._mask = tr, mask

    def write_line(self, line: str, **markup: bool) -> None:
        self._tr.write_line(self._mask(line), **markup)
