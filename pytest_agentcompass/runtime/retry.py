"""Runtime retries as data: which failures retry, and how much work a retry redoes.

Two tables and one decision. :data:`RETRY_SCOPE` says how much of an
attempt a failure in each stage redoes; :class:`RetryPolicy` (built from the
request's ``max_retries`` / ``retry_pattern_list``) says which failures may
retry at all; :func:`should_retry` is the only place that decides.

``retry_pattern_list: null`` retries any failure that has an error text (the
spec's rule), a list the failures whose text matches one of its regular
expressions, ``[]`` none. ``transient`` retries by kind instead: every
failure carries an :class:`ErrorKind`, decided from what was raised and
where (:func:`classify`), never from text the agent could have written, and
the transient policy retries the kinds no agent can cause.
"""

from __future__ import annotations

import enum
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..vocabulary.errors import EnvironmentLost, TaskSetupError, WorkspacePathError
from ..vocabulary.types import EvaluationMode

__all__ = [
    "AGENT_STAGES",
    "DECLARABLE_KINDS",
    "RETRY_SCOPE",
    "TRANSIENT",
    "TRANSIENT_KINDS",
    "ErrorKind",
    "RetryBudget",
    "RetryPolicy",
    "RetryScope",
    "Stage",
    "StageFailure",
    "classify",
    "declared_kind",
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
    """What kind of fault a failure is, decided from where it happened and what was raised.

    Never from text: an error message, a verifier's output or a file name can
    be written by the agent under test, which would then choose how it is
    retried. The transient policy (``retry_pattern_list: transient``) retries
    :data:`TRANSIENT_KINDS` only.
    """

    #: The runtime's own Environment call failed (opening one, switching its
    #: network), or the provider says the Environment was lost (:class:`EnvironmentLost`).
    ENVIRONMENT = "environment"
    TRANSPORT = "transport"  # a connection error or a server's 5xx, raised by a network client
    TIMEOUT = "timeout"  # a network call, or a stage the agent has no part in, ran out of time
    #: A stage the agent takes part in (inference, artifacts, evaluation) ran out of time:
    #: the agent can cause it (hang, freeze its verifier), so it is no transient fault.
    STAGE_TIMEOUT = "stage_timeout"
    RATE_LIMIT = "rate_limit"  # a RateLimitError (429) raised by a client
    PROGRAMMING = "programming"  # TypeError and friends: a retry repeats the bug
    MISSING_REWARD = "missing_reward"  # evaluate gave no score, or one that is not a finite number
    PERMANENT = "permanent"  # its source says no retry can fix it (e.g. a rejected API key)
    #: sys.exit(), KeyboardInterrupt or another BaseException from a lifecycle method: never retried.
    EXIT = "exit"
    #: The task's own files leave no Environment to open (:class:`TaskSetupError`): never retried.
    TASK = "task"
    OTHER = "other"


#: What ``retry_pattern_list: transient`` retries.
TRANSIENT_KINDS: frozenset[ErrorKind] = frozenset(
    {ErrorKind.ENVIRONMENT, ErrorKind.TRANSPORT, ErrorKind.TIMEOUT, ErrorKind.RATE_LIMIT}
)
#: Kinds a component may state for an error result it returns (``metadata["error_kind"]``):
#: a model harness knows its endpoint answered 429. Never ``environment``: a returned
#: result is not an infrastructure fault; only the runtime's own calls are.
DECLARABLE_KINDS: frozenset[ErrorKind] = frozenset(
    {ErrorKind.TRANSPORT, ErrorKind.TIMEOUT, ErrorKind.RATE_LIMIT, ErrorKind.PERMANENT}
)
#: Stages in which the agent (or what it left behind) takes part: a timeout there is its doing as
#: much as anyone's. Environment and preparation run before the agent in every try.
AGENT_STAGES: frozenset[Stage] = frozenset({Stage.INFERENCE, Stage.INFERENCE_RESULT, Stage.ARTIFACTS, Stage.EVALUATION})

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
    }
)
_EXIT = frozenset({"UserBaseException", "UserExit"})
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


def classify(exc: BaseException | None, stage: Stage | None = None) -> ErrorKind:
    """The kind of a raised failure, from its exception's class (and module) and the stage.

    There is no text to look at on purpose (see :class:`ErrorKind`). A
    :class:`SessionError` or a Docker SDK error raised inside a benchmark's or
    harness's own code is ``other``: a file the agent broke or a container it
    killed raises those too. Only the runtime's own Environment calls (which
    pass ``environment`` themselves) and :class:`EnvironmentLost` are
    ``environment``.
    """
    if exc is None:
        return ErrorKind.OTHER
    names = {cls.__name__ for cls in type(exc).__mro__}
    if names & _EXIT:
        return ErrorKind.EXIT
    if isinstance(exc, WorkspacePathError) or names & _PROGRAMMING:
        return ErrorKind.PROGRAMMING
    if isinstance(exc, TaskSetupError):
        return ErrorKind.TASK
    if isinstance(exc, EnvironmentLost):
        return ErrorKind.ENVIRONMENT
    if names & _RATE_LIMIT:
        return ErrorKind.RATE_LIMIT
    if names & _TIMEOUT:
        return ErrorKind.TIMEOUT
    if isinstance(exc, TimeoutError):  # asyncio's, or one of the component's own waits
        return ErrorKind.STAGE_TIMEOUT if stage in AGENT_STAGES else ErrorKind.TIMEOUT
    if isinstance(exc, ConnectionError) or names & _TRANSPORT:
        return ErrorKind.TRANSPORT
    if type(exc).__module__.split(".", 1)[0] in _TRANSPORT_MODULES:
        return ErrorKind.TRANSPORT
    return ErrorKind.OTHER


def declared_kind(metadata: Mapping[str, Any]) -> ErrorKind:
    """The kind a component stated for an error result it returned, if it may state it; else ``other``.

    ``retryable: False`` is ``permanent``; ``error_kind`` is taken when it is one of
    :data:`DECLARABLE_KINDS`.
    """
    if metadata.get("retryable") is False:
        return ErrorKind.PERMANENT
    value = metadata.get("error_kind")
    try:
        kind = ErrorKind(value) if isinstance(value, str) else ErrorKind.OTHER
    except ValueError:
        return ErrorKind.OTHER
    return kind if kind in DECLARABLE_KINDS else ErrorKind.OTHER


class StageFailure(Exception):
    """A failure of one stage, carrying what a retry detail needs.

    :param error: The error text matched against ``retry_pattern_list``.
    :param trace: A trimmed traceback, kept in the terminal result.
    :param payload: The error :class:`RunResult` a stage returned, if it returned one.
    :param kind: Decided by :func:`classify` from ``cause`` (or, for a returned
        error result, by :func:`declared_kind`) unless given.
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
        if kind is None:
            metadata = getattr(payload, "metadata", None)
            kind = declared_kind(metadata) if cause is None and isinstance(metadata, Mapping) else None
        self.kind = kind or classify(cause, stage)


#: ``retry_pattern_list: transient``: retry the :data:`TRANSIENT_KINDS`, nothing else.
TRANSIENT = "transient"


@dataclass(frozen=True)
class RetryPolicy:
    """Which failures may retry, as data.

    :param patterns: ``None`` (the spec's default): any failure with an error
        text retries; a tuple: failures whose error text matches one of the
        regular expressions; ``()``: none.
    :param kinds: Set by the transient policy: failures of these kinds retry,
        and ``patterns`` is not used.
    """

    max_retries: int = 0
    patterns: tuple[str, ...] | None = None
    kinds: frozenset[ErrorKind] | None = None
    backoff_seconds: float = 0.0

    @classmethod
    def of(cls, max_retries: int, patterns: Sequence[str] | str | None, backoff_seconds: float = 0.0) -> RetryPolicy:
        """The policy of ``execution.max_retries`` / ``retry_pattern_list`` (``None``, a list or ``"transient"``)."""
        if patterns == TRANSIENT:
            return cls(max_retries, None, TRANSIENT_KINDS, backoff_seconds)
        if isinstance(patterns, str):
            raise ValueError(f"retry_pattern_list: {patterns!r} is not a policy (null, a list, or {TRANSIENT!r})")
        return cls(max_retries, None if patterns is None else tuple(patterns), backoff_seconds=backoff_seconds)


def should_retry(policy: RetryPolicy, failure: StageFailure, used: int) -> str | None:
    """The one retry decision: why ``failure`` retries, or ``None``.

    The reason is the matching pattern, ``kind:<kind>`` (the transient policy)
    or ``any`` (``retry_pattern_list: null``). A ``sys.exit()`` never retries;
    a failure whose source says no retry can fix it (``permanent``) retries
    only when an explicit pattern names it.
    """
    if used >= policy.max_retries or not failure.error or failure.kind in (ErrorKind.EXIT, ErrorKind.TASK):
        return None
    if policy.kinds is not None:
        return f"kind:{failure.kind.value}" if failure.kind in policy.kinds else None
    if policy.patterns is None:
        return None if failure.kind is ErrorKind.PERMANENT else "any"
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
