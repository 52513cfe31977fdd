"""The metrics a benchmark returns, and a config's gates checked against them when the request is built.

A gate's metric name is checked against the names the benchmark's
``aggregate_metrics`` is known to return (the default aggregation's names, or
what a custom one declares in ``metric_names``): an unknown name is a config
error with its file and line, and so is a minimum outside the metric's range
(``1.5`` or ``-1`` for ``pass@1``: never met, or always). A custom aggregation
that declares nothing can only be checked once it has run
(``reports.gate_check``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..config import LoadedConfig, RunRequest
from ..vocabulary.errors import ConfigError
from .base import BaseBenchmark

__all__ = ["DEFAULT_METRICS", "PASS_AT_K", "check_gate_names", "known_metric_names", "metric_range"]

#: What the default ``aggregate_metrics`` returns (``pass@<k>`` is added for the request's k).
DEFAULT_METRICS = ("tasks", "scored", "errors", "passed", "k", "mean_score", "pass@1")
#: In ``metric_names``: the pass rate at the request's k, whatever it is.
PASS_AT_K = "pass@<k>"
#: The values the default metrics can take, ``None`` for no bound (scores are any finite number).
DEFAULT_RANGES: dict[str, tuple[float | None, float | None]] = {
    "tasks": (0, None),
    "scored": (0, None),
    "errors": (0, None),
    "passed": (0, None),
    "k": (1, None),
    "mean_score": (None, None),
}


def known_metric_names(benchmark: Any, req: RunRequest) -> set[str] | None:
    """The metric names ``benchmark`` returns, or ``None`` when they are only known after aggregation."""
    if type(benchmark).aggregate_metrics is BaseBenchmark.aggregate_metrics:
        return {*DEFAULT_METRICS, f"pass@{req.execution.attempts.k}"}
    declared: Sequence[str] | None = getattr(benchmark, "metric_names", None)
    if declared is None:
        return None
    # "pass@<k>" declares the pass rate at the request's own k (pass@2 is no metric of a k=1 run).
    return {f"pass@{req.execution.attempts.k}" if name == PASS_AT_K else name for name in declared}


def metric_range(benchmark: Any, name: str) -> tuple[float | None, float | None]:
    """The values metric ``name`` can take (``None``: no bound): what the benchmark declares in
    ``metric_ranges``, else the default metrics' (any ``pass@<k>`` is a share, in [0, 1])."""
    declared: Mapping[str, Sequence[float | None]] = getattr(benchmark, "metric_ranges", None) or {}
    if name in declared:
        low, high = declared[name]
        return low, high
    if name.startswith("pass@"):
        return 0.0, 1.0
    return DEFAULT_RANGES.get(name, (None, None))


def check_gate_names(loaded: LoadedConfig | None, index: int, req: RunRequest, benchmark: Any) -> None:
    """Refuse gates on metrics the benchmark is known not to return, and minimums outside a metric's range.

    :raises ConfigError: ``file:line: requests[i].gates.<name>: ...`` per problem.
    """
    if not req.gates:
        return
    known = known_metric_names(benchmark, req)
    problems: list[tuple[str, str]] = []
    if known is not None:
        choices = ", ".join(sorted(known))
        problems += [
            (name, f"unknown metric {name!r}; {type(benchmark).__name__} returns: {choices}")
            for name in req.gates
            if name not in known
        ]
    for name, minimum in req.gates.items():
        if known is not None and name not in known:
            continue
        low, high = metric_range(benchmark, name)
        if high is not None and minimum > high:
            problems.append((name, f"minimum {minimum:g} can never be met: {name} is at most {high:g}"))
        elif low is not None and minimum < low:
            problems.append((name, f"minimum {minimum:g} is always met: {name} is at least {low:g}"))
    if not problems:
        return
    messages = []
    for name, text in problems:
        loc = ("requests", index, "gates", name)
        messages.append(str(loaded.error_at(loc, text)) if loaded else f"{req.name}: gates.{name}: {text}")
    raise ConfigError("\n".join(messages))
