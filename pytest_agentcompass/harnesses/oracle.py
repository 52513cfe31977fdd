"""The ``oracle`` harness: runs a Harbor task's reference solution.

``solution/`` is copied to ``/solution`` and ``bash /solution/solve.sh`` runs
as root in the image's WORKDIR with ``[solution] env``. A benchmark whose
tasks do not all score 1.0 under ``oracle`` is broken: it is the standard
sanity check of a task set.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel

from ..config import ParamsModel
from ..types import ExecutionPlan, PreparedTask, RunResult, RunStatus, TaskSpec
from .base import BaseHarness

if TYPE_CHECKING:
    from ..config import RunRequest
    from ..environments.base import EnvironmentSession

__all__ = ["OracleHarness"]

#: Characters of the solution's output kept in the result.
_TAIL = 2000
#: solve.sh's output (stdout and stderr, in order) to the result and to /logs/agent/oracle.txt;
#: its exit code stays the pipeline's.
_SOLVE = "set -o pipefail; bash /solution/solve.sh 2>&1 | tee /logs/agent/oracle.txt"


class OracleParams(ParamsModel):
    """``oracle`` takes no params."""


class OracleHarness(BaseHarness):
    """Runs ``solution/solve.sh`` of the task directory (``TaskSpec.metadata["path"]``)."""

    id = "oracle"
    params_model: ClassVar[type[BaseModel]] = OracleParams

    async def run(
        self,
        session: Any,
        task: TaskSpec,
        prepared: PreparedTask,
        env: EnvironmentSession,
        req: RunRequest,
        plan: ExecutionPlan,
    ) -> RunResult:
        from ..benchmarks.harbor.benchmark import harbor_task
        from ..benchmarks.harbor.taskdir import expand_env
        from ..benchmarks.harbor.verifier import run_as_root, tail, upload_tree

        if "path" not in task.metadata:
            raise RuntimeError(f"task {task.task_id!r} has no task directory: the oracle runs Harbor tasks only")
        parsed = harbor_task(task)
        solution = parsed.path / "solution"
        if not (solution / "solve.sh").is_file():
            return RunResult(
                task_id=task.task_id,
                status=RunStatus.INFERENCE_ERROR,
                error=f"{solution / 'solve.sh'} does not exist: the task has no reference solution",
            )
        environ = expand_env(parsed.solution_env, "solution", parsed)
        await upload_tree(env, solution, "/solution")
        # The transcript is kept where Harbor keeps it (copied out with the agent's
        # logs), written by tee in the same exec rather than uploaded after it.
        outcome = await run_as_root(env, ["bash", "-c", _SOLVE], environ=environ)
        # The verifier decides: a failing solve.sh is recorded, not an inference error.
        return RunResult(
            task_id=task.task_id,
            output=tail(outcome.stdout, _TAIL),
            metadata={
                "agent": {
                    "exit_code": outcome.exit_code,
                    **({"stderr": tail(outcome.stderr, _TAIL)} if outcome.stderr else {}),
                }
            },
        )
