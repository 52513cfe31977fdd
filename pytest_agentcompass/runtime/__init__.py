"""The runtime: plans, attempts, retries, the run store and the Orchestrator.

It knows nothing about pytest and can be driven by a plain ``asyncio.run``.
Names load on first use: code that needs one runtime module must not load
the Orchestrator and the rest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import _load_export

if TYPE_CHECKING:
    from .orchestrator import OrchestrationResult, Orchestrator
    from .planner import Planner, Recipe, resolve_evaluation_mode
    from .request import RequestRuntime
    from .retry import RETRY_SCOPE, RetryBudget, RetryScope, Stage
    from .store import RunStore
    from .strategies import AttemptScheduler, AttemptStrategy, AverageStrategy, PassStrategy
    from .task import TaskOutcome

_EXPORTS = {
    "RETRY_SCOPE": ".retry",
    "AttemptScheduler": ".strategies",
    "AttemptStrategy": ".strategies",
    "AverageStrategy": ".strategies",
    "OrchestrationResult": ".orchestrator",
    "Orchestrator": ".orchestrator",
    "PassStrategy": ".strategies",
    "Planner": ".planner",
    "Recipe": ".planner",
    "RequestRuntime": ".request",
    "RetryBudget": ".retry",
    "RetryScope": ".retry",
    "RunStore": ".store",
    "Stage": ".retry",
    "TaskOutcome": ".task",
    "resolve_evaluation_mode": ".planner",
}

__all__ = [
    "RETRY_SCOPE",
    "AttemptScheduler",
    "AttemptStrategy",
    "AverageStrategy",
    "OrchestrationResult",
    "Orchestrator",
    "PassStrategy",
    "Planner",
    "Recipe",
    "RequestRuntime",
    "RetryBudget",
    "RetryScope",
    "RunStore",
    "Stage",
    "TaskOutcome",
    "resolve_evaluation_mode",
]


def __getattr__(name: str) -> Any:
    return _load_export(__name__, _EXPORTS, name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
