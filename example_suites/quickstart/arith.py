"""A harness-free arithmetic benchmark that runs anywhere.

The "agent" is a real subprocess in the task's workspace that computes the
answer with integer arithmetic only, so the division tasks whose answer is
not a whole number fail for real.
"""

from __future__ import annotations

import dataclasses
import random
import sys

from pytest_agentcompass import (
    EnvironmentSession,
    ExecutionPlan,
    HarnessFreeBenchmark,
    PreparedTask,
    RunRequest,
    RunResult,
    TaskSpec,
)

OPERATORS = {"+": "addition", "*": "multiplication", "/": "division"}
SOLVER = (
    "import sys; a, op, b = open('question.txt').read().split(); print(eval(f'{a} {op.replace(\"/\", \"//\")} {b}'))"
)


def score_answer(result: RunResult, expected: float) -> RunResult:
    try:
        score = 1.0 if abs(float(str(result.output)) - expected) < 1e-9 else 0.0
    except ValueError:
        score = 0.0
    return dataclasses.replace(result, score=score)


class ArithmeticBenchmark(HarnessFreeBenchmark):
    evaluation_environment_mode = "none"

    def __init__(self, n: int = 20, seed: int = 7) -> None:
        super().__init__(n=n, seed=seed)
        self.n = n
        self.seed = seed

    def load_tasks(self, req: RunRequest) -> list[TaskSpec]:
        rng = random.Random(self.seed)
        tasks = []
        for i in range(self.n):
            op = "+*/"[i % 3]
            a, b = rng.randint(2, 60), rng.randint(2, 9)
            expected = {"+": a + b, "*": a * b, "/": a / b}[op]
            tasks.append(
                TaskSpec(
                    task_id=f"arith-{i:03d}",
                    question=f"{a} {op} {b}",
                    category=OPERATORS[op],
                    ground_truth=expected,
                )
            )
        return tasks

    async def prepare_task(
        self, task: TaskSpec, env: EnvironmentSession, req: RunRequest, benchmark_plan: object
    ) -> PreparedTask:
        await env.write_text("question.txt", task.question)
        return PreparedTask(task_id=task.task_id, prompt=task.question)

    async def run_task(
        self, task: TaskSpec, prepared: PreparedTask, env: EnvironmentSession, req: RunRequest, plan: ExecutionPlan
    ) -> RunResult:
        solved = await env.exec([sys.executable, "-c", SOLVER], timeout=30)
        if not solved.ok:
            return RunResult(task_id=task.task_id, status="inference_error", error=solved.stderr)  # type: ignore[arg-type]
        return RunResult(task_id=task.task_id, output=solved.stdout.strip())

    async def evaluate(
        self,
        task: TaskSpec,
        prepared: PreparedTask,
        result: RunResult,
        req: RunRequest,
        plan: ExecutionPlan,
        env: EnvironmentSession | None = None,
    ) -> RunResult:
        if env is not None:
            raise RuntimeError("none evaluation must not receive an Environment")
        return score_answer(result, float(task.ground_truth))
