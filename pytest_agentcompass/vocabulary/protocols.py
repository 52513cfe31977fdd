"""The two extension points that are protocols, not base classes: a Recipe adjusts
an ExecutionPlan, an AttemptStrategy decides how semantic attempts combine.

Their implementations live in ``runtime/`` (the Planner, the built-in strategies); the
contracts live here so a plugin author imports them without the runtime.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from .types import ExecutionPlan, RunResult, TaskSpec

if TYPE_CHECKING:
    from ..config import RunRequest

__all__ = ["AttemptStrategy", "Recipe"]


@runtime_checkable
class Recipe(Protocol):
    """A registered plan adjuster.

    :attr overrides: The plan fields this recipe may change; the Planner
        rejects an adjustment that touches any other field.
    """

    name: str
    overrides: frozenset[str]

    def matches(self, req: RunRequest, task: TaskSpec) -> bool: ...

    def adjust(self, plan: ExecutionPlan, req: RunRequest, task: TaskSpec) -> ExecutionPlan: ...


@runtime_checkable
class AttemptStrategy(Protocol):
    """What a registered strategy provides."""

    name: str

    def needs_more(self, k: int, done: Mapping[int, RunResult], pass_threshold: float) -> bool:
        """Whether any further attempt index should run."""
        ...

    def combine(self, k: int, done: Mapping[int, RunResult], pass_threshold: float) -> RunResult:
        """The task's terminal result from its evaluated attempts (``done`` is non-empty)."""
        ...
