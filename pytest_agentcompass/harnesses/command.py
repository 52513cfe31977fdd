"""The ``command`` harness: runs an agent command line inside the task Environment."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Any

from ..types import ExecutionPlan, PreparedTask, RunResult, RunStatus, TaskSpec
from .base import BaseHarness

if TYPE_CHECKING:
    from ..config import RunRequest
    from ..environments.base import EnvironmentSession

__all__ = ["CommandHarness"]


class CommandHarness(BaseHarness):
    """Runs ``params.command`` (a list, or a string split like a shell would).

    The prompt reaches the command as ``$AGENTCOMPASS_PROMPT`` and in the
    file ``.agentcompass/prompt.txt``; its stdout becomes ``RunResult.output``.
    A non-zero exit or a timeout (``params.timeout``) is an inference error.
    """

    id = "command"

    def __init__(self, command: str | list[str], timeout: float | None = None, **params: Any) -> None:
        super().__init__(command=command, timeout=timeout, **params)
        self.argv = shlex.split(command) if isinstance(command, str) else list(command)
        self.timeout = timeout

    async def run(
        self,
        session: Any,
        task: TaskSpec,
        prepared: PreparedTask,
        env: EnvironmentSession,
        req: RunRequest,
        plan: ExecutionPlan,
    ) -> RunResult:
        await env.write_text(".agentcompass/prompt.txt", prepared.prompt)
        outcome = await env.exec(
            self.argv,
            timeout=self.timeout,
            env={"AGENTCOMPASS_PROMPT": prepared.prompt, "AGENTCOMPASS_TASK_ID": task.task_id},
            cwd=prepared.workdir,
        )
        evidence = {
            "exit_code": outcome.exit_code,
            "timed_out": outcome.timed_out,
            "stderr": outcome.stderr[-2000:],
        }
        if not outcome.ok:
            reason = "timed out" if outcome.timed_out else f"exited with {outcome.exit_code}"
            return RunResult(
                task_id=task.task_id,
                output=outcome.stdout,
                status=RunStatus.INFERENCE_ERROR,
                error=f"agent command {reason}: {outcome.stderr.strip()[-500:]}",
                metadata={"agent": evidence},
            )
        return RunResult(task_id=task.task_id, output=outcome.stdout.strip(), metadata={"agent": evidence})
