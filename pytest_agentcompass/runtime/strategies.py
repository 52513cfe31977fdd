"""Semantic-attempt strategies and the scheduler that asks them what is left.

A strategy decides two things from the attempts evaluated so far: which
indices still need work, and how the attempts combine into the task result.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ..vocabulary.protocols import AttemptStrategy
from ..vocabulary.types import RunResult, RunStatus

__all__ = ["AttemptScheduler", "AttemptStrategy", "AverageStrategy", "PassStrategy", "STRATEGIES"]


def _scores(done: Mapping[int, RunResult]) -> dict[str, float | None]:
    return {str(i): (r.score if not r.is_error else None) for i, r in sorted(done.items())}


def _base(
    done: Mapping[int, RunResult], chosen: RunResult, k: int, extra: Mapping[str, Any] = {}, **changes: Any
) -> RunResult:
    """``chosen`` with the attempt bookkeeping every strategy records (one copy: this runs per task)."""
    metadata = {**chosen.metadata, **extra}
    metadata["attempt_scores"] = _scores(done)
    metadata["attempts"] = {"k": k, "completed": len(done)}
    return dataclasses.replace(chosen, metadata=metadata, **changes)


class AverageStrategy:
    """Runs every attempt; the task score is the mean of the scored attempts.

    Attempts that ended in an error carry no observation: they are excluded
    from the mean and counted in ``metadata.attempt_errors``. A task whose
    attempts all failed keeps the last error.
    """

    name = "avg"

    def needs_more(self, k: int, done: Mapping[int, RunResult], pass_threshold: float) -> bool:
        return len(done) < k

    def combine(self, k: int, done: Mapping[int, RunResult], pass_threshold: float) -> RunResult:
        scored = [r for _, r in sorted(done.items()) if not r.is_error and r.score is not None]
        last = done[max(done)]
        if not scored:
            return _base(done, last, k)
        mean = sum(float(r.score or 0.0) for r in scored) / len(scored)
        errors = len(done) - len(scored)
        extra = {"attempt_errors": errors} if errors else {}
        return _base(done, scored[-1], k, extra, score=mean, status=RunStatus.SCORED, error=None)


class PassStrategy:
    """Stops at the first attempt that scores at least the pass threshold.

    The task scores 1.0 when any attempt passed, otherwise the best score seen.
    """

    name = "pass"

    def needs_more(self, k: int, done: Mapping[int, RunResult], pass_threshold: float) -> bool:
        if any(_passed(r, pass_threshold) for r in done.values()):
            return False
        return len(done) < k

    def combine(self, k: int, done: Mapping[int, RunResult], pass_threshold: float) -> RunResult:
        ordered = [r for _, r in sorted(done.items())]
        for result in ordered:
            if _passed(result, pass_threshold):
                return _base(done, dataclasses.replace(result, score=1.0, status=RunStatus.SCORED), k)
        scored = [r for r in ordered if not r.is_error and r.score is not None]
        if not scored:
            return _base(done, ordered[-1], k)
        best = max(scored, key=lambda r: float(r.score or 0.0))
        return _base(done, best, k)


def _passed(result: RunResult, threshold: float) -> bool:
    return not result.is_error and result.score is not None and result.score >= threshold


STRATEGIES: dict[str, AttemptStrategy] = {"avg": AverageStrategy(), "pass": PassStrategy()}


class AttemptScheduler:
    """Hands out the attempt indices of one task that still need work.

    Indices are stable (``0..k-1``): a restored checkpoint fills its own index,
    so a resumed task runs exactly the missing ones.
    """

    def __init__(self, strategy: AttemptStrategy, k: int, pass_threshold: float) -> None:
        self.strategy = strategy
        self.k = k
        self.pass_threshold = pass_threshold
        self.done: dict[int, RunResult] = {}

    def restore(self, checkpoints: Mapping[int, RunResult]) -> None:
        self.done.update({i: r for i, r in checkpoints.items() if 0 <= i < self.k})

    def next_index(self) -> int | None:
        if not self.strategy.needs_more(self.k, self.done, self.pass_threshold):
            return None
        missing = [i for i in range(self.k) if i not in self.done]
        return missing[0] if missing else None

    def record(self, index: int, result: RunResult) -> None:
        self.done[index] = result

    def combine(self) -> RunResult:
        return self.strategy.combine(self.k, self.done, self.pass_threshold)
