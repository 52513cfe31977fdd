"""The Harness contract: how an agent or model is driven through one task."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ..vocabulary.types import ExecutionPlan, PreparedTask, TaskSpec

if TYPE_CHECKING:
    from ..config import RunRequest
    from ..environments.base import EnvironmentSession
    from ..gateway import ModelGateway
    from ..models.ledger import Protocol
    from ..vocabulary.artifacts import RunFiles

__all__ = ["BaseHarness"]


class BaseHarness:
    """Drives an agent. ``params`` from the config's ``harness.params`` arrive
    as constructor keyword arguments.

    The planner calls :meth:`adjust_plan` for every new plan; the runtime
    then calls :meth:`adjust_input`, :meth:`start_session`, then
    :meth:`run` under the plan's run network policy, and always
    :meth:`close_session` afterwards, before artifacts are collected.
    Methods may be sync or async.
    """

    id: ClassVar[str] = ""
    #: The request's run directory, set before the first attempt: to read (a benchmark reads back
    #: the artifacts it saved). Nothing writes there but the store: save files with
    #: :func:`~pytest_agentcompass.save_artifact` (an attempt's) or :attr:`run_files` (the request's).
    run_dir: Path | None = None
    #: The request's own files in its run directory (``RunFiles``), set with :attr:`run_dir`.
    run_files: RunFiles | None = None
    #: The agent calls the model over HTTP from inside the task Environment (an agent CLI): the
    #: runtime then serves a model gateway for the request and sets :attr:`gateway` (when the
    #: request names a ``model``). An instance may set it in ``__init__`` from its params.
    needs_gateway: bool = False
    #: The model APIs the agent speaks (``openai_chat``, ``openai_responses``, ``anthropic``,
    #: ``gemini``): each needs an upstream key at preflight. Empty: any one will do.
    gateway_protocols: ClassVar[frozenset[Protocol]] = frozenset()
    #: The request's :class:`~pytest_agentcompass.gateway.ModelGateway`, shared by its attempts
    #: (``async with self.gateway.open_attempt(env, task_id, attempt_index) as grant: ...``).
    gateway: ModelGateway | None = None
    #: The schema of ``model.params`` this harness reads when it calls the model itself (a strict
    #: pydantic model, e.g. :class:`~pytest_agentcompass.models.ModelSettings`); checked when the
    #: request is built, with the config's file and line. A gateway harness's are the gateway's.
    model_settings: ClassVar[type[Any] | None] = None

    def __init__(self, **params: Any) -> None:
        self.params = params

    def preflight(self, req: RunRequest) -> Any:
        """Check, once per request and before any task runs, that the harness can work
        (a package, a model key). Raise an ``AgentCompassError`` with a plain message."""
        return None

    def adjust_plan(self, plan: ExecutionPlan, task: TaskSpec, req: RunRequest) -> Any:
        """Add what the harness needs from the Environment to a new plan, before it opens
        (an agent CLI's install recipe in ``plan.environment``). Runs after the benchmark's
        ``adjust_plan``, before recipes; returns the plan."""
        return plan

    def adjust_input(self, task: TaskSpec, prepared: PreparedTask, req: RunRequest, plan: ExecutionPlan) -> Any:
        """Rewrite the prepared input for this harness (prompt templates, tool lists)."""
        return prepared

    def start_session(
        self,
        task: TaskSpec,
        prepared: PreparedTask,
        env: EnvironmentSession,
        req: RunRequest,
        plan: ExecutionPlan,
    ) -> Any:
        """Acquire per-attempt state (a client, an agent process); returned to :meth:`run`."""
        return None

    def run(
        self,
        session: Any,
        task: TaskSpec,
        prepared: PreparedTask,
        env: EnvironmentSession,
        req: RunRequest,
        plan: ExecutionPlan,
    ) -> Any:
        """Execute the task and return the raw :class:`RunResult` (never a score)."""
        raise NotImplementedError(f"{type(self).__name__} must implement run(...)")

    def close_session(self, session: Any) -> Any:
        """Release what :meth:`start_session` acquired. Must be idempotent."""
        return None

    def aclose(self) -> Any:
        """Release what the harness shares between its tasks (a model client).

        Called on the event loop that ran the tasks, when the request ends,
        also after Ctrl-C or the deadline (within the cleanup grace).
        Must be idempotent.
        """
        return None
