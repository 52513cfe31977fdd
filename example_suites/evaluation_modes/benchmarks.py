"""The three evaluation modes, with evaluators written in the specification's style.

The ``evaluate`` and ``collect_artifacts`` bodies follow the specification's
code samples unchanged; only the imports and the parts the samples leave out
(loading tasks, preparing the workspace, the agent) are this project's.
The ``local`` provider copies ``template/`` into every workspace, so the
verifiers under ``/opt/verifier`` exist in task and evaluation sessions alike.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace
from typing import Any

from pytest_agentcompass import (
    BaseBenchmark,
    EnvironmentSession,
    ExecutionPlan,
    HarnessFreeBenchmark,
    PreparedTask,
    RunRequest,
    RunResult,
    TaskSpec,
    apply_verifier_result,
)


def score_answer(result: RunResult) -> RunResult:
    expected = result.metadata.get("expected")
    return dataclasses.replace(result, score=1.0 if str(result.output).strip() == str(expected) else 0.0)


class ExactMatchBenchmark(HarnessFreeBenchmark):
    """``none``: the answer alone decides; the agent sums numbers with a real subprocess."""

    evaluation_environment_mode = "none"

    def load_tasks(self, req: RunRequest) -> list[TaskSpec]:
        return [
            TaskSpec(task_id="sum-small", question="2 3", ground_truth="5"),
            TaskSpec(task_id="sum-large", question="40 2", ground_truth="42"),
            TaskSpec(task_id="sum-wrong", question="1 1", ground_truth="3"),
        ]

    async def run_task(
        self, task: TaskSpec, prepared: PreparedTask, env: EnvironmentSession, req: RunRequest, plan: ExecutionPlan
    ) -> RunResult:
        a, b = task.question.split()
        out = await env.exec(["sh", "-c", f"echo $(({a} + {b}))"], timeout=30)
        return RunResult(task_id=task.task_id, output=out.stdout.strip(), metadata={"expected": task.ground_truth})

    async def evaluate(
        self,
        task: TaskSpec,
        prepared: PreparedTask,
        result: RunResult,
        req: RunRequest,
        plan: ExecutionPlan,
        env: EnvironmentSession | None = None,
    ) -> RunResult:
        _ = task, prepared, req, plan
        if env is not None:
            raise RuntimeError("none evaluation must not receive an Environment")
        return score_answer(result)


class WorkspaceBenchmark(BaseBenchmark):
    """``reuse``: the verifier inspects the workspace the agent (the ``command`` harness) left."""

    evaluation_environment_mode = "reuse"

    def load_tasks(self, req: RunRequest) -> list[TaskSpec]:
        return [TaskSpec(task_id="greet", question="Write hello into greeting.txt")]

    async def evaluate(
        self,
        task: TaskSpec,
        prepared: PreparedTask,
        result: RunResult,
        req: RunRequest,
        plan: ExecutionPlan,
        env: EnvironmentSession | None = None,
    ) -> RunResult:
        _ = task, prepared, req, plan
        if env is None:
            raise RuntimeError("workspace verification requires reuse mode")
        verifier = await env.exec(
            ["python3", "/opt/verifier/check.py"],
            timeout=300,
        )
        return apply_verifier_result(result, verifier)


@dataclass(frozen=True)
class PatchPlan:
    submission_path: str


class PatchBenchmark(BaseBenchmark):
    """``fresh``: the submission crosses to a pristine evaluation session as an artifact."""

    evaluation_environment_mode = "fresh"

    def load_tasks(self, req: RunRequest) -> list[TaskSpec]:
        return [TaskSpec(task_id="fix-status", question="Make app.py report status fixed")]

    def make_benchmark_plan(self, task: TaskSpec, req: RunRequest) -> PatchPlan:
        return PatchPlan(submission_path="/work/submission.patch")

    def _require_plan(self, benchmark_plan: Any) -> PatchPlan:
        if not isinstance(benchmark_plan, PatchPlan):
            raise TypeError(f"expected a PatchPlan, got {type(benchmark_plan).__name__}")
        return benchmark_plan

    async def prepare_task(
        self, task: TaskSpec, env: EnvironmentSession, req: RunRequest, benchmark_plan: Any
    ) -> PreparedTask:
        plan = self._require_plan(benchmark_plan)
        await env.write_text("/work/app.py", await env.read_text("/opt/project/app.py"))
        return PreparedTask(
            task_id=task.task_id,
            prompt=task.question,
            workdir="/work",
            metadata={"submission_path": plan.submission_path},
        )

    async def collect_artifacts(
        self,
        task: TaskSpec,
        prepared: PreparedTask,
        result: RunResult,
        env: EnvironmentSession,
        req: RunRequest,
        plan: ExecutionPlan,
    ) -> RunResult:
        _ = task, prepared, req
        benchmark_plan = self._require_plan(plan.benchmark_plan)
        patch = await env.read_text(benchmark_plan.submission_path)

        artifacts = dict(result.artifacts)
        files = dict(artifacts.get("file") or {})
        files["submission.patch"] = patch
        artifacts["file"] = files
        return replace(result, artifacts=artifacts)

    async def evaluate(
        self,
        task: TaskSpec,
        prepared: PreparedTask,
        result: RunResult,
        req: RunRequest,
        plan: ExecutionPlan,
        env: EnvironmentSession | None = None,
    ) -> RunResult:
        _ = task, prepared, req, plan
        if env is None:
            raise RuntimeError("isolated verification requires fresh mode")

        patch = str(result.artifacts["file"]["submission.patch"])
        await env.write_text("/tmp/submission.patch", patch)
        verifier = await env.exec(
            ["bash", "/opt/verifier/run.sh", "/tmp/submission.patch"],
            timeout=600,
        )
        return apply_verifier_result(result, verifier)
