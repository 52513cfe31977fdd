"""Token usage per call, per task and per request, with an optional cost estimate."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Usage", "format_usage", "sum_usage"]

_COUNTS = ("calls", "prompt_tokens", "completion_tokens", "total_tokens")


@dataclass(slots=True)
class Usage:
    """Token counts as the endpoint reported them; ``cost`` only when prices are configured."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cost: float | None = None

    def add_call(self, prompt: int, completion: int, total: int | None = None) -> None:
        self.calls += 1
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
        if self.cost is not None:
            out["cost"] = self.cost
        return out


def sum_usage(records: Iterable[Mapping[str, Any] | None]) -> dict[str, Any] | None:
    """The totals of several ``usage`` dicts (``None`` when none carried usage).

    ``cost`` is summed over the records that have one; ``tasks`` counts the records.
    """
    totals: dict[str, Any] = dict.fromkeys(_COUNTS, 0)
    tasks = 0
    cost: float | None = None
    for record in records:
        if not isinstance(record, Mapping):
            continue
        tasks += 1
        for name in _COUNTS:
            value = record.get(name)
            if isinstance(value, int | float):
                totals[name] += int(value)
        if isinstance(record.get("cost"), int | float):
            cost = (cost or 0.0) + float(record["cost"])
    if not tasks:
        return None
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
    return line
