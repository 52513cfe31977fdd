"""The ``oracle`` harness: runs a task's reference solution.

A benchmark names the solution in ``PreparedTask.metadata["reference_solution"]``
(``harbor`` does, for ``solution/solve.sh``)::

    {"folder": <local folder>, "target": <path in the environment>,
     "command": [...], "env": {...}}

The folder is copied to ``target`` and ``command`` runs there as root (in the
environment's working directory) with ``env``; its output (stdout and stderr,
in order) is the result's output and the transcript: the try's artifact
``agent/oracle.txt``, beside what other harnesses keep there (``agent/stdout.txt``)
and apart from the copies of the environment's folders (Harbor's ``logs/agent/``),
which cannot replace it. It is written on the host, not into the environment: it
is the runner's record, which no verifier reads (and one engine request less).
A solution may leave a service running: the command returns when its own
process does. A benchmark whose tasks do not all pass under ``oracle`` is
broken: it is the standard sanity check of a task set.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel

from ..config import ParamsModel
from ..environments.transfer import run_as_root, upload_tree
from ..vocabulary.artifacts import save_artifact
from ..vocabulary.types import ExecutionPlan, PreparedTask, RunResult, RunStatus, TaskSpec
from .base import BaseHarness

if TYPE_CHECKING:
    from ..config import RunRequest
    from ..environments.base import EnvironmentSession

__all__ = ["OracleHarness"]

#: Characters of the solution's output kept in the result.
_TAIL = 2000
#: The transcript's artifact name (the harness's own folder, as ``command``'s ``agent/stdout.txt``).
TRANSCRIPT = "agent/oracle.txt"
#: stderr joins stdout in order; ``exec`` so the solution's exit code is the command's.
_MERGED = ["bash", "-c", 'exec "$@" 2>&1', "oracle"]


class OracleParams(ParamsModel):
    """``oracle`` takes no params."""


class OracleHarness(BaseHarness):
    """Runs the reference solution the benchmark's ``prepare_task`` names (see the module docstring)."""

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
        reference = prepared.metadata.get("reference_solution")
        if not isinstance(reference, Mapping) or "folder" not in reference:
            missing = reference.get("missing") if isinstance(reference, Mapping) else None
            why = (
                f"{missing} does not exist: the task has no reference solution"
                if missing
                else f"task {task.task_id!r} names no reference solution (the oracle runs tasks whose benchmark "
                "sets PreparedTask.metadata['reference_solution'], as harbor does)"
            )
            return RunResult(task_id=task.task_id, status=RunStatus.INFERENCE_ERROR, error=why)
        await upload_tree(env, Path(str(reference["folder"])), str(reference["target"]))
        command = [str(arg) for arg in reference["command"]]
        outcome = await run_as_root(env, [*_MERGED, *command], environ=dict(reference.get("env") or {}))
        save_artifact(TRANSCRIPT, outcome.stdout)
        # The verifier decides: a failing solution is recorded, not an inference error.
        return RunResult(
            task_id=task.task_id,
            output=_tail(outcome.stdout),
            metadata={
                "agent": {
                    "exit_code": outcome.exit_code,
                    **({"stderr": _tail(outcome.stderr)} if outcome.stderr else {}),
                }
            },
        )


def _tail(text: str) -> str:
    return text if len(text) <= _TAIL else "..." + text[-_TAIL:]
