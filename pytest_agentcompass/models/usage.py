"""Token usage per call, per task and per request, with an optional cost estimate."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Usage", "format_usage", "sum_usage", "unknown_usage_note"]

_COUNTS = ("calls", "prompt_tokens", "completion_tokens", "total_tokens")
#: Counted like :data:`_COUNTS` but written only when not zero (most runs have none).
_UNKNOWN = "calls_without_usage"


@dataclass(slots=True)
class Usage:
    """Token counts as the endpoint reported them; ``cost`` only when prices are configured.

    ``calls_without_usage``: calls among ``calls`` whose usage never arrived (an answer cut
    off, an agent that hung up first, an endpoint that reports none); their tokens are in
    none of the totals, which are then a lower bound.
    """

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cost: float | None = None
    calls_without_usage: int = 0

    def add_call(self, prompt: int, completion: int, total: int | None = None) -> None:
        self.calls += 1
        self.add_tokens(prompt, completion, total)

    def add_tokens(self, prompt: int, completion: int, total: int | None = None) -> None:
        self.prompt_tokens += prompt
        self.completion_tokens += completion
        self.total_tokens += total if total is not None else prompt + completion

    def price(self, input_per_million: float | None, output_per_million: float | None) -> None:
        """Set :attr:`cost` from prices per million tokens (both needed)."""
        if input_per_million is None or output_per_million is None:
            return
        self.cost = round(
            (self.prompt_tokens * input_per_million + self.completion_tokens * output_per_million) / 1e6, 6
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {name: getattr(self, name) for name in _COUNTS}
        if self.calls_without_usage:
            out[_UNKNOWN] = self.calls_without_usage
        if self.cost is not None:
            out["cost"] = self.cost
        return out


def sum_usage(records: Iterable[Mapping[str, Any] | None]) -> dict[str, Any] | None:
    """The totals of several ``usage`` dicts (``None`` when none carried usage).

    ``cost`` is summed over the records that have one; ``tasks`` counts the records;
    ``calls_without_usage`` is there when some call had none.
    """
    totals: dict[str, Any] = dict.fromkeys((*_COUNTS, _UNKNOWN), 0)
    tasks = 0
    cost: float | None = None
    for record in records:
        if not isinstance(record, Mapping):
            continue
        tasks += 1
        for name in (*_COUNTS, _UNKNOWN):
            value = record.get(name)
            if isinstance(value, int | float):
                totals[name] += int(value)
        if isinstance(record.get("cost"), int | float):
            cost = (cost or 0.0) + float(record["cost"])
    if not tasks:
        return None
    if not totals[_UNKNOWN]:
        del totals[_UNKNOWN]
    totals["tasks"] = tasks
    if cost is not None:
        totals["cost"] = round(cost, 6)
    return totals


def format_usage(totals: Mapping[str, Any]) -> str:
    """One line for the terminal summary."""
    line = (
        f"{totals.get('calls', 0)} model calls, {totals.get('prompt_tokens', 0)} prompt + "
        f"{totals.get('completion_tokens', 0)} completion = {totals.get('total_tokens', 0)} tokens"
    )
    if "cost" in totals:
        line += f", estimated cost {totals['cost']:.4f}"
    if totals.get(_UNKNOWN):
        line += f" ({unknown_usage_note(int(totals[_UNKNOWN]))})"
    return line


def unknown_usage_note(calls: int) -> str:
    """What the totals do not hold when ``calls`` calls reported no usage."""
    return (
        f"{calls} call(s) with unknown usage (cut off, hung up on, or none reported): "
        "their tokens are in neither these totals nor the token budget"
    )
