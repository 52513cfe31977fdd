"""A benchmark that records what each try of an attempt was given, for the retry spec tests.

Every lifecycle call appends one JSON line to ``params.log`` naming the
attempt's benchmark plan (a fresh token per ``make_benchmark_plan`` call), the
prepared task and run result it received (tokens too) and the Environment.
``fail: {<stage>: {"times": N, "how": ...}}`` fails the first N calls of a
stage (``prepare``, ``run``, ``artifacts``, ``evaluate``), each semantic
attempt (each plan: retries reuse theirs) counted apart; ``how`` is ``raise`` (a ``RuntimeError``),
``type_error``, ``result`` (an error result with text), ``empty`` (an error
result without text) or ``no_score``.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from pathlib import Path
from typing import Any

from pytest_agentcompass import (
    EnvironmentSession,
    ExecutionPlan,
    HarnessFreeBenchmark,
    PreparedTask,
    RunRequest,
    RunResult,
    RunStatus,
    TaskSpec,
)


def read_log(path: str | Path) -> list[dict[str, Any]]:
    file = Path(path)
    return [json.loads(line) for line in file.read_text().splitlines()] if file.exists() else []


class SpecBenchmark(HarnessFreeBenchmark):
    def __init__(self, log: str, mode: str = "none", n: int = 1, fail: dict[str, Any] | None = None) -> None:
        super().__init__(log=log, mode=mode, n=n, fail=fail or {})
        self.log, self.fail = log, fail or {}
        self.evaluation_environment_mode = mode  # type: ignore[misc]

    def _write(self, event: str, **fields: Any) -> None:
        with open(self.log, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"event": event, **fields}) + "\n")

    def _failure(self, stage: str, plan: str) -> str | None:
        spec = self.fail.get(stage)
        if not spec:
            return None
        done = sum(1 for e in read_log(self.log) if e["event"] == stage and e["plan"] == plan)
        return str(spec.get("how", "raise")) if done <= int(spec["times"]) else None

    def load_tasks(self, req: RunRequest) -> list[TaskSpec]:
        return [TaskSpec(f"t{i}", question=f"q{i}") for i in range(int(self.params["n"]))]

    def make_benchmark_plan(self, task: TaskSpec, req: RunRequest) -> dict[str, str]:
        token = uuid.uuid4().hex[:8]  # the preflight makes one too, for a plan it checks and drops
        self._write("plan", task=task.task_id, plan=token)
        return {"token": token}

    def prepare_task(self, task: TaskSpec, env: EnvironmentSession, req: RunRequest, benchmark_plan: Any) -> Any:
        plan = benchmark_plan["token"]
        prepared = PreparedTask(task.task_id, prompt=task.question, metadata={"token": uuid.uuid4().hex[:8]})
        self._write("prepare", task=task.task_id, plan=plan, env=env.describe())
        how = self._failure("prepare", plan)
        if how:
            raise RuntimeError(f"prepare failed ({how})")
        return prepared

    def run_task(
        self, task: TaskSpec, prepared: PreparedTask, env: EnvironmentSession, req: RunRequest, plan: ExecutionPlan
    ) -> RunResult:
        attempt = plan.attempt_index
        self._write(
            "run",
            task=task.task_id,
            attempt=attempt,
            plan=plan.benchmark_plan["token"],
            prepared=prepared.metadata["token"],
            env=env.describe(),
        )
        how = self._failure("run", plan.benchmark_plan["token"])
        if how == "raise":
            raise RuntimeError("the agent crashed")
        if how == "type_error":
            return task.question + 1  # type: ignore[no-any-return, operator]
        if how in ("result", "empty"):
            text = "the agent gave up" if how == "result" else ""
            return RunResult(task.task_id, status=RunStatus.INFERENCE_ERROR, error=text)
        return RunResult(task.task_id, output=uuid.uuid4().hex[:8])

    def collect_artifacts(
        self,
        task: TaskSpec,
        prepared: PreparedTask,
        result: RunResult,
        env: EnvironmentSession,
        req: RunRequest,
        plan: ExecutionPlan,
    ) -> RunResult:
        token = plan.benchmark_plan["token"]
        self._write("artifacts", task=task.task_id, plan=token, output=result.output)
        if self._failure("artifacts", token):
            raise RuntimeError("collecting artifacts failed")
        return result

    def evaluate(
        self,
        task: TaskSpec,
        prepared: PreparedTask,
        result: RunResult,
        req: RunRequest,
        plan: ExecutionPlan,
        env: EnvironmentSession | None = None,
    ) -> RunResult:
        attempt = plan.attempt_index
        self._write(
            "evaluate",
            task=task.task_id,
            attempt=attempt,
            plan=plan.benchmark_plan["token"],
            prepared=prepared.metadata["token"],
            output=result.output,
            env=env.describe() if env is not None else None,
        )
        how = self._failure("evaluate", plan.benchmark_plan["token"])
        if how == "raise":
            raise RuntimeError("the grader failed")
        if how in ("result", "empty"):
            text = "the grader gave up" if how == "result" else ""
            return dataclasses.replace(result, status=RunStatus.EVALUATION_ERROR, error=text)
        if how == "no_score":
            return result
        return dataclasses.replace(result, score=1.0)
