"""Runtime retries: which failures retry, and how much work a retry redoes.

The scope rules are one table (:data:`RETRY_SCOPE`) so tests can walk it.
"""

from __future__ import annotations

import enum
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from ..types import EvaluationMode

__all__ = ["RETRY_SCOPE", "RetryBudget", "RetryScope", "Stage", "StageFailure", "retry_scope"]


class Stage(enum.StrEnum):
    """Where in an attempt a failure happened."""

    ENVIRONMENT = "environment"
    PREPARATION = "preparation"
    INFERENCE = "inference"
    INFERENCE_RESULT = "inference_result"  # the run path returned an error result
    ARTIFACTS = "artifacts"
    EVALUATION = "evaluation"
    GENERAL = "general"


class RetryScope(enum.StrEnum):
    """How much of the attempt a retry redoes."""

    ATTEMPT = "attempt"  # new task Environment, same plan
    EVALUATE = "evaluate"  # evaluate again with the same prepared task and run result
    EVALUATION_ENVIRONMENT = "evaluation_environment"  # reopen the fresh session, evaluate again


#: (stage, evaluation mode or None for "any mode") -> scope.
RETRY_SCOPE: dict[tuple[Stage, EvaluationMode | None], RetryScope] = {
    (Stage.ENVIRONMENT, None): RetryScope.ATTEMPT,
    (Stage.PREPARATION, None): RetryScope.ATTEMPT,
    (Stage.INFERENCE, None): RetryScope.ATTEMPT,
    (Stage.INFERENCE_RESULT, None): RetryScope.ATTEMPT,
    (Stage.ARTIFACTS, None): RetryScope.ATTEMPT,
    (Stage.GENERAL, None): RetryScope.ATTEMPT,
    # The evaluator shared the task Environment's state: only a new attempt is clean.
    (Stage.EVALUATION, "reuse"): RetryScope.ATTEMPT,
    (Stage.EVALUATION, "none"): RetryScope.EVALUATE,
    (Stage.EVALUATION, "fresh"): RetryScope.EVALUATION_ENVIRONMENT,
}


def retry_scope(stage: Stage, mode: EvaluationMode) -> RetryScope:
    return RETRY_SCOPE.get((stage, mode)) or RETRY_SCOPE[(stage, None)]


class StageFailure(Exception):
    """A failure of one stage, carrying what a retry detail needs.

    :param error: The error text matched against ``retry_pattern_list``.
    :param trace: A trimmed traceback, kept in the terminal result.
    """

    def __init__(self, stage: Stage, error: str, trace: str | None = None, payload: object = None) -> None:
        super().__init__(error)
        self.stage = stage
        self.error = error
        self.trace = trace
        self.payload = payload


@dataclass
class RetryBudget:
    """The retries left to one semantic attempt, shared by all its stages."""

    max_retries: int
    patterns: Sequence[str] | None
    backoff_seconds: float = 0.0
    used: int = 0

    def match(self, error: str, *, permanent: bool = False) -> str | None:
        """The pattern that makes ``error`` retryable (``"*"`` for the match-all default), or None.

        A ``permanent`` error (one its source says no retry can fix) is not
        matched by the default; an explicit pattern may still name it.
        """
        if not error:
            return None
        if self.patterns is None:
            return None if permanent else "*"
        for pattern in self.patterns:
            if re.search(pattern, error):
                return pattern
        return None

    def take(self, error: str, *, permanent: bool = False) -> str | None:
        """Spend one retry on ``error`` if it is retryable and budget is left."""
        if self.used >= self.max_retries:
            return None
        pattern = self.match(error, permanent=permanent)
        if pattern is not None:
            self.used += 1
        return pattern

    def delay(self) -> float:
        """Exponential backoff with full jitter, so a transient outage is not burnt through at once."""
        if self.backoff_seconds <= 0:
            return 0.0
        return random.uniform(0, self.backoff_seconds * (2 ** (self.used - 1)))
