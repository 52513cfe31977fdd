"""The ``nop`` harness: does nothing. A task it passes is broken (its verifier
accepts the untouched environment), which makes it the second sanity check."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel

from ..config import ParamsModel
from ..vocabulary.types import ExecutionPlan, PreparedTask, RunResult, TaskSpec
from .base import BaseHarness

if TYPE_CHECKING:
    from ..config import RunRequest
    from ..environments.base import EnvironmentSession

__all__ = ["NopHarness"]


class NopParams(ParamsModel):
    """``nop`` takes no params."""


class NopHarness(BaseHarness):
    id = "nop"
    params_model: ClassVar[type[BaseModel]] = NopParams

    def run(
        self,
        session: Any,
        task: TaskSpec,
        prepared: PreparedTask,
        env: EnvironmentSession,
        req: RunRequest,
        plan: ExecutionPlan,
    ) -> RunResult:
        return RunResult(task_id=task.task_id, output="")
