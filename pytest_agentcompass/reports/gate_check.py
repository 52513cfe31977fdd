"""Gates: minimum values of a request's aggregate metrics, judged once the request is finalized.

Their names and minimums were checked when the request was built
(``benchmarks.metrics``). A custom aggregation that declares no metric names
can only be checked here: a gate on a metric it did not return fails, naming
the metric and the ones it did return.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["GateCheck", "check_gates"]


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
