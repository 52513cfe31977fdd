"""A benchmark, harness and provider that log every lifecycle call.

Each call appends one JSON line to ``params.trace`` so tests can read the
exact order of calls, across threads and processes. Failures are injected
with ``fail: {"<stage>": N}`` (fail the first N calls of that stage),
delays with ``sleep: {"<stage>": seconds}``, and ``barrier: {dir, count}``
makes each task wait in ``run_task`` until ``count`` tasks are in it at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field

from pytest_agentcompass import (
    BaseBenchmark,
    BaseHarness,
    EnvironmentSession,
    ExecutionPlan,
    HarnessFreeBenchmark,
    LocalEnvironment,
    LocalSession,
    PreparedTask,
    RunRequest,
    RunResult,
    RunStatus,
    SessionConfig,
    TaskSpec,
)
from pytest_agentcompass.environments.local import LocalParams

_lock = threading.Lock()
_counts: dict[tuple[str, str], int] = {}


def log(trace: str, event: str, **fields: Any) -> None:
    line = json.dumps({"event": event, "pid": os.getpid(), **fields}, default=str)
    with _lock, open(trace, "a", encoding="utf-8") as fh:
        fh.write(line + "\n")


def read_trace(trace: str | Path) -> list[dict[str, Any]]:
    path = Path(trace)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _should_fail(trace: str, fail: Mapping[str, Any], stage: str, task_id: str) -> bool:
    spec = fail.get(stage)
    if spec is None:
        return False
    if isinstance(spec, dict):  # per task
        spec = spec.get(task_id, 0)
    with _lock:
        key = (trace + task_id, stage)
        _counts[key] = _counts.get(key, 0) + 1
        return _counts[key] <= int(spec) or int(spec) < 0


class _Tracing:
    params: dict[str, Any]

    def _log(self, event: str, **fields: Any) -> None:
        log(self.params["trace"], event, **fields)

    async def _step(self, stage: str, task_id: str) -> None:
        delay = (self.params.get("sleep") or {}).get(stage)
        if delay:
            await asyncio.sleep(float(delay))
        if _should_fail(self.params["trace"], self.params.get("fail") or {}, stage, task_id):
            raise ConnectionError(f"injected {stage} failure")


class TracingBenchmark(_Tracing, HarnessFreeBenchmark):
    """``n`` tasks; the answer is the question upper-cased, written to ``answer.txt``."""

    def __init__(
        self,
        trace: str,
        n: int = 3,
        mode: str = "none",
        wrong: list[str] | None = None,
        categories: list[str] | None = None,
        **params: Any,
    ) -> None:
        super().__init__(trace=trace, n=n, mode=mode, wrong=wrong or [], categories=categories, **params)
        self.evaluation_environment_mode = mode  # type: ignore[misc]

    def load_tasks(self, req: RunRequest) -> list[TaskSpec]:
        self._log("load_tasks", request=req.name)
        cats = self.params.get("categories") or ["alpha", "beta"]
        return [
            TaskSpec(task_id=f"t{i}", question=f"q{i}", category=cats[i % len(cats)], ground_truth=f"Q{i}")
            for i in range(int(self.params["n"]))
        ]

    def select_tasks(self, tasks: Any, req: RunRequest) -> Any:
        self._log("select_tasks", request=req.name)
        return tasks

    async def prepare_task(
        self, task: TaskSpec, env: EnvironmentSession, req: RunRequest, benchmark_plan: Any
    ) -> PreparedTask:
        self._log("prepare_task", task=task.task_id, env=env.describe())
        await self._step("prepare", task.task_id)
        await env.write_text("question.txt", task.question)
        return PreparedTask(task_id=task.task_id, prompt=task.question)

    async def run_task(
        self, task: TaskSpec, prepared: PreparedTask, env: EnvironmentSession, req: RunRequest, plan: ExecutionPlan
    ) -> RunResult:
        self._log("run_task", task=task.task_id, policy=env.network_policy, attempt=plan.attempt_index)
        hang = self.params.get("hang_if") or {}
        if hang and Path(hang["file"]).exists() and plan.attempt_index in hang.get("attempts", [plan.attempt_index]):
            await asyncio.sleep(3600)
        barrier = self.params.get("barrier") or {}
        if barrier:  # wait until ``count`` tasks (in any process) are running at once
            Path(barrier["dir"], task.task_id).touch()
            while len(os.listdir(barrier["dir"])) < int(barrier["count"]):
                await asyncio.sleep(0.02)
        per_attempt = self.params.get("fail_each_attempt") or {}
        if _should_fail(self.params["trace"] + f"#{plan.attempt_index}", per_attempt, "run", task.task_id):
            raise ConnectionError(f"injected run failure in attempt {plan.attempt_index}")
        await self._step("run", task.task_id)
        faults = self.params.get("fault") or {}
        if _should_fail(self.params["trace"], faults, "type_error", task.task_id):
            return task.question + 1  # type: ignore[operator]  # a bug in benchmark code
        if _should_fail(self.params["trace"], faults, "connection", task.task_id):
            raise ConnectionResetError("injected connection reset")
        if _should_fail(self.params["trace"], self.params.get("error_result") or {}, "run", task.task_id):
            text = self.params.get("error_text", "rate limited (429)")  # what an agent could have printed
            status = self.params.get("error_status", RunStatus.INFERENCE_ERROR)
            return RunResult(task_id=task.task_id, status=status, error=text)
        answer = task.question.upper() if task.task_id not in self.params["wrong"] else "nope"
        await env.write_text("answer.txt", answer)
        return RunResult(task_id=task.task_id, output=answer)

    async def collect_artifacts(
        self,
        task: TaskSpec,
        prepared: PreparedTask,
        result: RunResult,
        env: EnvironmentSession,
        req: RunRequest,
        plan: ExecutionPlan,
    ) -> RunResult:
        self._log("collect_artifacts", task=task.task_id, env=env.describe(), policy=env.network_policy)
        await self._step("artifacts", task.task_id)
        answer = await env.read_text("answer.txt")
        return dataclasses.replace(result, artifacts={"file": {"answer.txt": answer}})

    async def evaluate(
        self,
        task: TaskSpec,
        prepared: PreparedTask,
        result: RunResult,
        req: RunRequest,
        plan: ExecutionPlan,
        env: EnvironmentSession | None = None,
    ) -> RunResult:
        sees_workspace = None
        if env is not None:
            try:
                await env.read_text("answer.txt")
                sees_workspace = True
            except Exception:
                sees_workspace = False
        self._log(
            "evaluate",
            task=task.task_id,
            env=env.describe() if env else None,
            policy=env.network_policy if env else None,
            sees_workspace=sees_workspace,
            mode=plan.evaluation_environment_mode,
        )
        await self._step("evaluate", task.task_id)
        faults = self.params.get("fault") or {}
        if _should_fail(self.params["trace"], faults, "no_score", task.task_id):
            return result
        if _should_fail(self.params["trace"], faults, "nan_score", task.task_id):
            return dataclasses.replace(result, score=float("nan"))
        answer = result.artifacts["file"]["answer.txt"]
        return dataclasses.replace(result, score=1.0 if answer == task.ground_truth else 0.0)


class TracingHarnessBenchmark(TracingBenchmark, BaseBenchmark):
    """The same benchmark, meant to be driven by :class:`TracingHarness`."""


class TracingHarness(_Tracing, BaseHarness):
    def __init__(self, trace: str, **params: Any) -> None:
        super().__init__(trace=trace, **params)

    def adjust_input(
        self, task: TaskSpec, prepared: PreparedTask, req: RunRequest, plan: ExecutionPlan
    ) -> PreparedTask:
        self._log("adjust_input", task=task.task_id)
        return dataclasses.replace(prepared, prompt=prepared.prompt + "!")

    async def start_session(
        self, task: TaskSpec, prepared: PreparedTask, env: EnvironmentSession, req: RunRequest, plan: ExecutionPlan
    ) -> dict[str, str]:
        self._log("start_session", task=task.task_id, policy=env.network_policy)
        return {"task": task.task_id}

    async def run(
        self,
        session: Any,
        task: TaskSpec,
        prepared: PreparedTask,
        env: EnvironmentSession,
        req: RunRequest,
        plan: ExecutionPlan,
    ) -> RunResult:
        self._log("harness_run", task=task.task_id, policy=env.network_policy, prompt=prepared.prompt)
        await self._step("run", task.task_id)
        await env.write_text("answer.txt", task.question.upper())
        return RunResult(task_id=task.task_id, output=task.question.upper())

    async def close_session(self, session: Any) -> None:
        self._log("close_session", task=session["task"])
        if (self.params.get("fail") or {}).get("close_session"):
            raise RuntimeError("injected close_session failure")


class TracingSession(LocalSession):
    def __init__(self, root: Path, provider: TracingEnvironment, purpose: str) -> None:
        super().__init__(root)
        self.provider = provider
        self.purpose = purpose

    async def set_network_policy(self, policy: Any) -> None:
        self.provider._log("set_network_policy", env=self.describe(), policy=policy, purpose=self.purpose)
        self.network_policy = policy

    async def close(self) -> None:
        self.provider._log("env_close", env=self.describe(), purpose=self.purpose)
        await super().close()
        if (self.provider.spec.params.get("fail") or {}).get("close"):
            raise RuntimeError("injected close failure")


class TracingParams(LocalParams):
    trace: str
    fail: dict[str, Any] = Field(default_factory=dict)
    sleep: dict[str, Any] = Field(default_factory=dict)


class TracingEnvironment(LocalEnvironment):
    """A local workspace that records open/close and can switch policies."""

    id = "tracing"
    params_model = TracingParams
    supported_network_policies = frozenset({"full", "disabled"})
    dynamic_network_policy = True

    def _log(self, event: str, **fields: Any) -> None:
        log(self.spec.params["trace"], event, **fields)

    def build_config(self, plan: ExecutionPlan, purpose: Any, labels: Any = None) -> SessionConfig:
        fail = self.spec.params.get("fail") or {}
        if _should_fail(self.spec.params["trace"], fail, "build_config", plan.task_id):
            raise ConnectionError("injected build_config failure")
        return super().build_config(plan, purpose, labels)

    async def open(self, config: SessionConfig) -> EnvironmentSession:
        delay = (self.spec.params.get("sleep") or {}).get("open")
        if delay:
            await asyncio.sleep(float(delay))
        fail = self.spec.params.get("fail") or {}
        if _should_fail(self.spec.params["trace"], fail, f"open_{config.purpose}", config.task_id):
            raise RuntimeError(f"injected open failure ({config.purpose})")
        base = await super().open(config)
        assert isinstance(base, LocalSession)
        session = TracingSession(base.root, self, config.purpose)
        session.network_policy = config.network_policy
        self._log(
            "env_open",
            env=session.describe(),
            purpose=config.purpose,
            task=config.task_id,
            policy=config.network_policy,
        )
        return session
