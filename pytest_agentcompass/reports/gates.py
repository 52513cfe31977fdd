"""Gates: minimum values of a request's aggregate metrics.

Metric names are checked twice. When the config is built, against the names
the benchmark's ``aggregate_metrics`` is known to return (the default
aggregation's names, or what a custom one declares in ``metric_names``): an
unknown name is then a config error with its file and line. A custom
aggregation that declares nothing can only be checked once it has run: a
gate on a metric it did not return fails, naming the metric and the ones it
did return.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..benchmark import BaseBenchmark
from ..config import LoadedConfig, RunRequest
from ..errors import ConfigError

__all__ = ["GateCheck", "check_gates", "check_gate_names", "known_metric_names"]

#: What the default ``aggregate_metrics`` returns (``pass@<k>`` is added for the request's k).
DEFAULT_METRICS = ("tasks", "scored", "errors", "passed", "k", "mean_score", "pass@1")


def known_metric_names(benchmark: Any, req: RunRequest) -> set[str] | None:
    """The metric names ``benchmark`` returns, or ``None`` when they are only known after aggregation."""
    if type(benchmark).aggregate_metrics is BaseBenchmark.aggregate_metrics:
        return {*DEFAULT_METRICS, f"pass@{req.execution.attempts.k}"}
    declared: Sequence[str] | None = getattr(benchmark, "metric_names", None)
    return set(declared) if declared is not None else None


def check_gate_names(loaded: LoadedConfig | None, index: int, req: RunRequest, benchmark: Any) -> None:
    """Refuse gates on metrics the benchmark is known not to return.

    :raises ConfigError: ``file:line: requests[i].gates.<name>: ...`` per unknown name.
    """
    known = known_metric_names(benchmark, req)
    if known is None or not req.gates:
        return
    unknown = [name for name in req.gates if name not in known]
    if not unknown:
        return
    choices = ", ".join(sorted(known))
    messages = []
    for name in unknown:
        loc = ("requests", index, "gates", name)
        text = f"unknown metric {name!r}; {type(benchmark).__name__} returns: {choices}"
        messages.append(str(loaded.error_at(loc, text)) if loaded else f"{req.name}: gates.{name}: {text}")
    raise ConfigError("\n".join(messages))


@dataclass(frozen=True)
class GateCheck:
    """The gates of one request against its metrics."""

    request: str
    met: list[str]
    missed: list[str]

    @property
    def passed(self) -> bool:
        return not self.missed

    def message(self) -> str:
        head = f"request {self.request!r}: {len(self.missed)} of {len(self.missed) + len(self.met)} gate(s) missed"
        return "\n".join([head, *(f"  {line}" for line in self.missed), *(f"  ok: {line}" for line in self.met)])


def check_gates(request: str, gates: Mapping[str, float], metrics: Mapping[str, Any] | None) -> GateCheck:
    """Each gate is met when its metric is a number at least the gate's minimum."""
    metrics = metrics or {}
    met: list[str] = []
    missed: list[str] = []
    for name, minimum in gates.items():
        if name not in metrics:
            returned = ", ".join(sorted(str(k) for k in metrics)) or "nothing"
            missed.append(f"{name}: not among the metrics aggregate_metrics returned ({returned})")
            continue
        value = metrics[name]
        if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
            missed.append(f"{name} = {value!r} is not a number (minimum {minimum:g})")
        elif value < minimum:
            missed.append(f"{name} = {value:.4g} is below the minimum {minimum:g}")
        else:
            met.append(f"{name} = {value:.4g} >= {minimum:g}")
    return GateCheck(request, met, missed)
