"""Benchmark base classes: what a benchmark author subclasses.

Every lifecycle method may be a plain function or a coroutine; the runtime
awaits whatever it gets back.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ..vocabulary.types import EvaluationMode, ExecutionPlan, PreparedTask, RunResult, RunStatus, TaskSpec

if TYPE_CHECKING:
    from ..config import RunRequest
    from ..environments.base import EnvironmentSession
    from ..vocabulary.artifacts import RunFiles

__all__ = ["BaseBenchmark", "HarnessFreeBenchmark", "MeanOf"]


class BaseBenchmark:
    """A set of tasks plus the rules that score them.

    Subclasses implement :meth:`load_tasks` and :meth:`evaluate`; the other
    hooks have sensible defaults. ``params`` from the config's
    ``benchmark.params`` arrive as keyword arguments of the constructor.
    """

    #: Default evaluation mode; a task's own mode and the request's override it.
    evaluation_environment_mode: ClassVar[EvaluationMode] = "none"
    #: The request's run directory, set before the first attempt: to read (a benchmark reads back
    #: the artifacts it saved). Nothing writes there but the store: save files with
    #: :func:`~pytest_agentcompass.save_artifact` (an attempt's) or :attr:`run_files` (the request's).
    run_dir: Path | None = None
    #: The request's own files in its run directory (``RunFiles``), set with :attr:`run_dir`.
    run_files: RunFiles | None = None

    def __init__(self, **params: Any) -> None:
        self.params = params

    # -- request scope -------------------------------------------------
    def load_tasks(self, req: RunRequest) -> Sequence[TaskSpec]:
        """Return every task of the benchmark. Called once per request."""
        raise NotImplementedError(f"{type(self).__name__} must implement load_tasks(req)")

    def select_tasks(self, tasks: Sequence[TaskSpec], req: RunRequest) -> Sequence[TaskSpec]:
        """Narrow the loaded tasks (a split, a sample). Called once per request."""
        return tasks

    def resolve_evaluation_environment_mode(self, req: RunRequest) -> EvaluationMode:
        """The benchmark-level default mode, used when neither request nor task sets one."""
        return self.evaluation_environment_mode

    def make_benchmark_plan(self, task: TaskSpec, req: RunRequest) -> Any:
        """Benchmark-specific plan data, stored as ``ExecutionPlan.benchmark_plan``."""
        return None

    def adjust_plan(self, plan: ExecutionPlan, task: TaskSpec, req: RunRequest) -> ExecutionPlan:
        """Fit a new plan to ``task`` (its own timeouts, network needs, ``environment``
        params) before recipes run. Leave what the request set explicitly alone."""
        return plan

    # -- attempt scope -------------------------------------------------
    def prepare_task(self, task: TaskSpec, env: EnvironmentSession, req: RunRequest, benchmark_plan: Any) -> Any:
        """Set the task Environment up and return the :class:`PreparedTask`."""
        return PreparedTask(task_id=task.task_id, prompt=task.question)

    def collect_artifacts(
        self,
        task: TaskSpec,
        prepared: PreparedTask,
        result: RunResult,
        env: EnvironmentSession,
        req: RunRequest,
        plan: ExecutionPlan,
    ) -> Any:
        """Copy what evaluation needs out of the still-open task Environment."""
        return result

    def evaluate(
        self,
        task: TaskSpec,
        prepared: PreparedTask,
        result: RunResult,
        req: RunRequest,
        plan: ExecutionPlan,
        env: EnvironmentSession | None = None,
    ) -> Any:
        """Return ``result`` with its authoritative ``score`` set."""
        raise NotImplementedError(f"{type(self).__name__} must implement evaluate(...)")

    # -- request end ---------------------------------------------------
    def aggregate_metrics(self, results: Sequence[RunResult], req: RunRequest) -> dict[str, Any]:
        """Request-level metrics from the terminal task results, in task order.

        The default reports ``mean_score`` and, over semantic attempts,
        ``pass@1`` (mean fraction of passing attempts) and ``pass@k`` (share
        of tasks with at least one passing attempt). Each is taken over every
        task: one that ended in an error counts as a failed task scoring 0,
        so that an error (which an agent can cause) never raises a metric.
        """
        threshold = req.execution.pass_threshold
        k = req.execution.attempts.k
        # One pass: ``results`` may be read from disk lazily, one task at a time.
        tasks = scored = errors = environment_errors = task_errors = passed = any_pass = 0
        total = MeanOf()
        pass_at_1 = 0.0
        for r in results:
            tasks += 1
            if r.is_error or r.score is None:
                errors += r.is_error
                environment_errors += r.status is RunStatus.ENVIRONMENT_ERROR
                task_errors += r.status is RunStatus.TASK_ERROR
                total.add(0.0)
                continue
            scored += 1
            total.add(float(r.score))
            passed += r.score >= threshold
            attempts = [float(s) for s in (r.metadata.get("attempt_scores") or {}).values() if s is not None]
            attempts = attempts or [float(r.score)]
            pass_at_1 += sum(1 for s in attempts if s >= threshold) / len(attempts)
            any_pass += any(s >= threshold for s in attempts)
        metrics: dict[str, Any] = {
            "tasks": tasks,
            "scored": scored,
            "errors": errors,
            "passed": passed,
            "k": k,
            "mean_score": total.value(),
        }
        if environment_errors:  # an infrastructure problem, not the agent's: shown apart
            metrics["environment_errors"] = environment_errors
        if task_errors:  # tasks broken by their own files: neither the agent's nor the infrastructure's
            metrics["task_errors"] = task_errors
        if tasks:
            metrics["pass@1"] = pass_at_1 / tasks
            metrics[f"pass@{k}"] = any_pass / tasks
        return metrics


class MeanOf:
    """The mean of finite floats, added one at a time, that never overflows.

    The plain sum is exact for ordinary scores; past a float's range (two
    scores of ``1e308``) the mean comes from a copy of the sum scaled down,
    which cannot overflow for any number of values a run can hold.
    """

    _SCALE = 2.0**-64

    def __init__(self) -> None:
        self.count = 0
        self._sum = 0.0
        self._scaled = 0.0

    def add(self, value: float) -> None:
        self.count += 1
        self._sum += value
        self._scaled += value * self._SCALE

    def value(self) -> float | None:
        if not self.count:
            return None
        if math.isfinite(self._sum):
            return self._sum / self.count
        return (self._scaled / self.count) / self._SCALE


class HarnessFreeBenchmark(BaseBenchmark):
    """A benchmark that runs its own inference: used with harness id ``none``."""

    def run_task(
        self,
        task: TaskSpec,
        prepared: PreparedTask,
        env: EnvironmentSession,
        req: RunRequest,
        plan: ExecutionPlan,
    ) -> Any:
        """Produce the raw (unscored) :class:`RunResult` of one attempt."""
        raise NotImplementedError(f"{type(self).__name__} must implement run_task(...)")
