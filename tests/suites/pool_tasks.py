"""Tasks that hold a container for a while, recording which engine each ran on (pool tests and perf)."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from pytest_agentcompass import HarnessFreeBenchmark, PreparedTask, RunRequest, RunResult, TaskSpec
from pytest_agentcompass.environments.base import EnvironmentSession
from pytest_agentcompass.vocabulary.types import ExecutionPlan


class PoolTasks(HarnessFreeBenchmark):
    """``n`` tasks; each sleeps ``sleep[engine]`` (or ``sleep["*"]``) seconds in its container.

    ``events``: a JSON-lines file of ``start``/``end`` per task and engine, written while the
    session is open, so the sessions an engine held at once can be counted from it.
    ``started``: a folder where each task leaves ``<task>@<engine-index>`` once running.
    ``build``: a build context every task's image is built from (as Harbor tasks bring).
    """

    def __init__(
        self,
        n: int = 4,
        sleep: dict[str, float] | None = None,
        events: str = "",
        started: str = "",
        engines: list[str] | None = None,
        mode: str = "none",
        build: str = "",
    ) -> None:
        super().__init__(n=n)
        self.n = n
        self.sleep = sleep or {}
        self.events = events
        self.started = started
        self.engines = engines or []
        self.evaluation_environment_mode = mode  # type: ignore[misc]
        self.build = build

    def adjust_plan(self, plan: ExecutionPlan, task: TaskSpec, req: RunRequest) -> ExecutionPlan:
        if not self.build:
            return plan
        return dataclasses.replace(plan, environment={"build": {"context": self.build}})  # each task's image

    def load_tasks(self, req: RunRequest) -> list[TaskSpec]:
        return [TaskSpec(f"t{i}") for i in range(self.n)]

    def _log(self, event: str, task: TaskSpec, engine: str | None) -> None:
        if self.events:
            with Path(self.events).open("a") as fh:
                record = {"event": event, "task": task.task_id, "engine": engine, "t": time.time()}
                fh.write(json.dumps(record) + "\n")

    async def run_task(
        self, task: TaskSpec, prepared: PreparedTask, env: EnvironmentSession, req: RunRequest, plan: ExecutionPlan
    ) -> RunResult:
        engine = env.placement
        self._log("start", task, engine)
        if self.started:
            index = self.engines.index(engine) if engine in self.engines else -1
            (Path(self.started) / f"{task.task_id}@{index}").touch()
        seconds = self.sleep.get(engine or "", self.sleep.get("*", 0))
        if seconds:
            done = await env.exec(["sleep", str(seconds)])
            if done.exit_code != 0:
                raise RuntimeError(f"sleep exited {done.exit_code}: {done.stderr}")
        self._log("end", task, engine)
        return RunResult(task.task_id, output=engine or "")

    def evaluate(
        self,
        task: TaskSpec,
        prepared: PreparedTask,
        result: RunResult,
        req: RunRequest,
        plan: ExecutionPlan,
        env: Any = None,
    ) -> RunResult:
        return dataclasses.replace(result, score=1.0)
