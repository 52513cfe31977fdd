"""Tasks an agent solves by writing a file; the verifier reads it in the task Environment."""

from __future__ import annotations

import dataclasses

from pytest_agentcompass import (
    BaseBenchmark,
    EnvironmentSession,
    ExecutionPlan,
    PreparedTask,
    RunRequest,
    RunResult,
    TaskSpec,
)
from pytest_agentcompass.vocabulary.errors import SessionError


class FileTasks(BaseBenchmark):
    """``n`` tasks: "write <content> into <file>"; score 1.0 when the file holds exactly that."""

    evaluation_environment_mode = "reuse"

    def __init__(self, n: int = 1, file: str = "hello.txt", content: str = "hi") -> None:
        super().__init__(n=n, file=file, content=content)
        self.n, self.file, self.content = n, file, content

    def load_tasks(self, req: RunRequest) -> list[TaskSpec]:
        return [
            TaskSpec(f"file-{i}", question=f"Write {self.content!r} into {self.file}.", ground_truth=self.content)
            for i in range(self.n)
        ]

    async def prepare_task(
        self, task: TaskSpec, env: EnvironmentSession, req: RunRequest, benchmark_plan: object
    ) -> PreparedTask:
        await env.write_text("README", "an empty project\n")
        return PreparedTask(task_id=task.task_id, prompt=task.question)

    async def evaluate(
        self,
        task: TaskSpec,
        prepared: PreparedTask,
        result: RunResult,
        req: RunRequest,
        plan: ExecutionPlan,
        env: EnvironmentSession | None = None,
    ) -> RunResult:
        assert env is not None
        try:
            written = await env.read_text(self.file)
        except SessionError:
            written = None
        return dataclasses.replace(result, score=float(written is not None and written.strip() == self.content))
