"""Runtime retries as data: which failures retry, and how much work a retry redoes.

Two tables and one decision. :data:`RETRY_SCOPE` says how much of an
attempt a failure in each stage redoes; :class:`RetryPolicy` (built from the
request's ``max_retries`` / ``retry_pattern_list``) says which failures may
retry at all; :func:`should_retry` is the only place that decides. Every
failure carries an :class:`ErrorKind` (see :func:`classify`) so that the
default policy can retry what is transient and nothing else.
"""

from __future__ import annotations

import enum
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..errors import SessionError, WorkspacePathError
from ..types import EvaluationMode

__all__ = [
    "RETRY_SCOPE",
    "TRANSIENT_KINDS",
    "ErrorKind",
    "RetryBudget",
    "RetryPolicy",
    "RetryScope",
    "Stage",
    "StageFailure",
    "classify",
    "retry_scope",
    "should_retry",
]


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
    """How much of the attempt a retry redoes (outermost first)."""

    ATTEMPT = "attempt"  # new task Environment, same plan
    EVALUATION_ENVIRONMENT = "evaluation_environment"  # reopen the fresh session, evaluate again
    EVALUATE = "evaluate"  # evaluate again with the same prepared task and run result


#: (stage, evaluation mode or None for "any mode") -> scope. The attempt
#: runner retries each failure at the level this table names, and nowhere else.
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


class ErrorKind(enum.StrEnum):
    """What kind of fault a failure is; the default policy retries the transient ones."""

    ENVIRONMENT = "environment"  # the Environment could not be opened or used
    TRANSPORT = "transport"  # a connection to a model or service failed, or it answered 5xx
    TIMEOUT = "timeout"  # a stage or a call ran out of time
    RATE_LIMIT = "rate_limit"  # 429, "rate limited", "overloaded"
    PROGRAMMING = "programming"  # TypeError and friends: a retry repeats the bug
    MISSING_REWARD = "missing_reward"  # evaluate gave no score, or one that is not a finite number
    PERMANENT = "permanent"  # its source says no retry can fix it (e.g. a rejected API key)
    OTHER = "other"


#: What ``retry_pattern_list: null`` retries.
TRANSIENT_KINDS: frozenset[ErrorKind] = frozenset(
    {ErrorKind.ENVIRONMENT, ErrorKind.TRANSPORT, ErrorKind.TIMEOUT, ErrorKind.RATE_LIMIT}
)

# Exception classes (by name, anywhere in the MRO: SDKs are imported lazily, if at all).
_PROGRAMMING = frozenset(
    {
        "TypeError",
        "AttributeError",
        "NameError",
        "LookupError",
        "ValueError",
        "AssertionError",
        "ImportError",
        "NotImplementedError",
        "ArithmeticError",
        "SyntaxError",
        "RecursionError",
        "ArtifactError",
        "ComponentError",
        "PolicyError",
        "ConfigError",
        "TaskIdError",
        "UserBaseException",
        "UserExit",
    }
)
_RATE_LIMIT = frozenset({"RateLimitError", "TooManyRequests"})
_TIMEOUT = frozenset({"APITimeoutError", "ReadTimeout", "ConnectTimeout", "TimeoutException", "PoolTimeout"})
_TRANSPORT = frozenset(
    {
        "APIConnectionError",
        "InternalServerError",
        "ServiceUnavailableError",
        "ConnectError",
        "RemoteProtocolError",
        "ProtocolError",
        "TransportError",
        "ClientConnectionError",
        "ServerDisconnectedError",
    }
)
_TRANSPORT_MODULES = frozenset({"httpx", "httpcore", "aiohttp", "urllib3", "requests", "websockets"})

# Error text of results that come back as errors (no exception to look at).
_TEXT_RULES: tuple[tuple[re.Pattern[str], ErrorKind], ...] = (
    (re.compile(r"\b429\b|rate.?limit|too many requests|overloaded", re.I), ErrorKind.RATE_LIMIT),
    (re.compile(r"timed? ?out\b|\btimeout\b", re.I), ErrorKind.TIMEOUT),
    (
        re.compile(
            r"\b50[0234]\b|connection (?:reset|refused|error|aborted|closed)|temporar(?:il)?y unavailable|"
            r"service unavailable|bad gateway|broken pipe|network is unreachable",
            re.I,
        ),
        ErrorKind.TRANSPORT,
    ),
)


def classify(exc: BaseException | None, text: str = "") -> ErrorKind:
    """The kind of a failure from its exception (class names, module) or, without one, its text."""
    if exc is not None:
        names = {cls.__name__ for cls in type(exc).__mro__}
        if isinstance(exc, WorkspacePathError) or names & _PROGRAMMING:
            return ErrorKind.PROGRAMMING
        if names & _RATE_LIMIT:
            return ErrorKind.RATE_LIMIT
        if isinstance(exc, TimeoutError) or names & _TIMEOUT:
            return ErrorKind.TIMEOUT
        if isinstance(exc, ConnectionError) or names & _TRANSPORT:
            return ErrorKind.TRANSPORT
        module = type(exc).__module__.split(".", 1)[0]
        if isinstance(exc, SessionError) or module == "docker":
            return ErrorKind.ENVIRONMENT
        if module in _TRANSPORT_MODULES:
            return ErrorKind.TRANSPORT
    for pattern, kind in _TEXT_RULES:
        if pattern.search(text):
            return kind
    return ErrorKind.OTHER


class StageFailure(Exception):
    """A failure of one stage, carrying what a retry detail needs.

    :param error: The error text matched against ``retry_pattern_list``.
    :param trace: A trimmed traceback, kept in the terminal result.
    :param kind: Decided by :func:`classify` from ``cause`` and ``error`` unless given.
    """

    def __init__(
        self,
        stage: Stage,
        error: str,
        trace: str | None = None,
        payload: object = None,
        *,
        cause: BaseException | None = None,
        kind: ErrorKind | None = None,
    ) -> None:
        super().__init__(error)
        self.stage = stage
        self.error = error
        self.trace = trace
        self.payload = payload
        self.kind = kind or classify(cause, error)


@dataclass(frozen=True)
class RetryPolicy:
    """Which failures may retry, as data.

    :param patterns: ``None``: failures of a kind in ``kinds`` retry (the
        transient ones by default); a list: failures whose error text matches
        one of the regular expressions retry, whatever their kind; ``[]``: none.
    """

    max_retries: int = 0
    patterns: tuple[str, ...] | None = None
    kinds: frozenset[ErrorKind] = TRANSIENT_KINDS
    backoff_seconds: float = 0.0

    @classmethod
    def of(cls, max_retries: int, patterns: Sequence[str] | None, backoff_seconds: float = 0.0) -> RetryPolicy:
        return cls(max_retries, None if patterns is None else tuple(patterns), backoff_seconds=backoff_seconds)


def should_retry(policy: RetryPolicy, failure: StageFailure, used: int) -> str | None:
    """The one retry decision: why ``failure`` retries (a pattern, or ``kind:<kind>``), or ``None``."""
    if used >= policy.max_retries or not failure.error:
        return None
    if policy.patterns is None:
        return f"kind:{failure.kind.value}" if failure.kind in policy.kinds else None
    for pattern in policy.patterns:
        if re.search(pattern, failure.error):
            return pattern
    return None


@dataclass
class RetryBudget:
    """The retries left to one semantic attempt, shared by all its stages."""

    policy: RetryPolicy
    used: int = field(default=0)

    def take(self, failure: StageFailure) -> str | None:
        """Spend one retry on ``failure`` if :func:`should_retry` allows it."""
        reason = should_retry(self.policy, failure, self.used)
        if reason is not None:
            self.used += 1
        return reason

    def delay(self) -> float:
        """Exponential backoff with full jitter, so a transient outage is not burnt through at once."""
        if self.policy.backoff_seconds <= 0:
            return 0.0
        return random.uniform(0, self.policy.backoff_seconds * (2 ** (self.used - 1)))
