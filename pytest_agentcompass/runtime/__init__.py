"""The runtime: plans, attempts, retries, the run store and the Orchestrator.

It knows nothing about pytest and can be driven by a plain ``asyncio.run``.
"""

from .orchestrator import OrchestrationResult, Orchestrator
from .planner import Planner, Recipe, resolve_evaluation_mode
from .request import RequestRuntime
from .retry import RETRY_SCOPE, RetryBudget, RetryScope, Stage
from .store import RunStore
from .strategies import AttemptScheduler, AttemptStrategy, AverageStrategy, PassStrategy
from .task import TaskOutcome

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
