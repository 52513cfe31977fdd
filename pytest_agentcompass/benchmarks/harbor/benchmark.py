"""The ``harbor`` benchmark: a folder of Harbor / Terminal-Bench 2 task directories.

Per task: the container comes from the task's ``docker_image`` or its
``environment/Dockerfile`` (the provider builds it); the agent gets
``instruction.md``; then, in the same container (evaluation mode ``reuse``),
``tests/`` is copied to ``/tests`` and ``bash /tests/test.sh`` decides the
score through ``/logs/verifier/reward.txt`` or ``reward.json``.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, Field

from ...benchmark import BaseBenchmark, MeanOf
from ...config import ConfigPath, ParamsModel
from ...errors import ComponentError
from ...types import EvaluationMode, ExecutionPlan, PreparedTask, RunResult, RunStatus, TaskSpec
from .taskdir import HarborTask, expand_env, files_digest, find_task_dirs, read_task
from .verifier import (
    LOG_DIRS,
    VERIFIER_LOGS,
    RewardError,
    fetch_tree,
    parse_rewards,
    redact_bytes,
    run_as_root,
    save_tree,
    tail,
    upload_tree,
)

if TYPE_CHECKING:
    from ...config import RunRequest
    from ...environments.base import EnvironmentSession

__all__ = ["HarborBenchmark", "HarborParams", "harbor_task"]

REWARD_FILES = ("reward.txt", "reward.json")
_SWAP_MARK = "agentcompass: cannot swap in /tests"
_SWAP_FAILED = 97
#: ``$1``: the uploaded tests, ``$2``: the verifier's log folder. Then ``bash /tests/test.sh``
#: replaces the shell, so the verifier's exit code and output are its own.
_SWAP_AND_VERIFY = (
    'rm -rf /tests "$2" && mkdir -p "$2" && chmod 777 "$2" && mv "$1" /tests'
    f' || {{ echo "{_SWAP_MARK}" >&2; exit {_SWAP_FAILED}; }}; exec bash /tests/test.sh'
)
#: A verifier container of its own (built from ``tests/``) is not built here: said once per request.
SEPARATE_NOTE = (
    "[verifier] environment_mode {modes} is not applied: the verifier ran in the task's own container "
    "(plan: verifier_environment_mode_not_applied)"
)
STORAGE_NOTE = "recorded per task (plan: storage_mb_recorded), not applied: the provider sets no disk quota"
#: Bytes of ``/logs/verifier`` read even when the artifact limit is lower: the reward must fit.
REWARD_ROOM = 1024 * 1024


class HarborParams(ParamsModel):
    """``benchmark.params`` of ``harbor``."""

    #: A folder of task directories, or one task directory; relative to the config file's folder.
    path: ConfigPath
    #: The ``reward.json`` entry that is the score (default: ``reward``, else the mean).
    reward_key: str | None = None
    #: Bytes of ``/logs/agent`` + ``/logs/artifacts`` (and of ``/logs/verifier``) copied per attempt.
    artifact_limit_bytes: int = Field(default=20 * 1024 * 1024, ge=0)


def harbor_task(task: TaskSpec) -> HarborTask:
    """The task directory behind a ``harbor`` TaskSpec, read again (cheap: two small files)."""
    return read_task(Path(str(task.metadata["path"])))


class HarborBenchmark(BaseBenchmark):
    """Runs Harbor task directories; see the module docstring."""

    params_model: ClassVar[type[BaseModel]] = HarborParams
    evaluation_environment_mode: ClassVar[EvaluationMode] = "reuse"

    def __init__(
        self, path: str | Path, reward_key: str | None = None, artifact_limit_bytes: int = 20 * 1024 * 1024
    ) -> None:
        super().__init__(path=str(path), reward_key=reward_key, artifact_limit_bytes=artifact_limit_bytes)
        self.path = Path(path).expanduser()
        self.reward_key = reward_key
        self.artifact_limit_bytes = artifact_limit_bytes
        self._parsed: dict[str, HarborTask] = {}

    def task(self, task: TaskSpec) -> HarborTask:
        """The parsed directory of ``task``, as loaded."""
        parsed = self._parsed.get(task.task_id)
        if parsed is None:
            parsed = self._parsed[task.task_id] = harbor_task(task)
        return parsed

    # -- request scope ---------------------------------------------------
    def load_tasks(self, req: RunRequest) -> Sequence[TaskSpec]:
        root = self.path if self.path.is_absolute() else Path.cwd() / self.path
        if not root.is_dir():
            raise ComponentError(f"benchmark 'harbor': params.path {root} is not a folder")
        tasks = []
        for path in find_task_dirs(root):
            parsed = read_task(path)
            self._parsed[parsed.name] = parsed
            tasks.append(self._spec(parsed))
        return tasks

    @staticmethod
    def _spec(parsed: HarborTask) -> TaskSpec:
        return TaskSpec(
            task_id=parsed.name,
            question=parsed.instruction,
            category=parsed.category,
            tags=parsed.tags,
            metadata={
                "path": str(parsed.path),
                "files": files_digest(parsed.path),
                "task_toml": parsed.config,
                **({"load_error": parsed.error} if parsed.error else {}),
            },
        )

    def adjust_plan(self, plan: ExecutionPlan, task: TaskSpec, req: RunRequest) -> ExecutionPlan:
        parsed = self.task(task)
        timeouts = dict(plan.timeouts)
        if timeouts.get("run") is None and parsed.agent_timeout:
            timeouts["run"] = parsed.agent_timeout
        run_policy = plan.run_network_policy
        if req.environment.network.run is None and not parsed.allow_internet:
            run_policy = "disabled"
        return dataclasses.replace(
            plan, timeouts=timeouts, run_network_policy=run_policy, environment=self._environment(parsed)
        )

    @staticmethod
    def _environment(parsed: HarborTask) -> dict[str, Any]:
        """Provider params for this task: its image or build, limits, and the image's WORKDIR."""
        env: dict[str, Any] = {"workdir": parsed.workdir}  # None: the image's WORKDIR
        problem = parsed.error or _unsupported(parsed)
        if problem:
            env["unavailable"] = problem
        if parsed.docker_image:  # used when the engine has it; else the Dockerfile is built
            env["task_image"] = parsed.docker_image
        if (parsed.environment_dir / "Dockerfile").is_file():
            env["build"] = {"context": str(parsed.environment_dir), "timeout": parsed.build_timeout}
        limits = {"cpus": parsed.cpus, "memory_mb": parsed.memory_mb}
        env.update({k: v for k, v in limits.items() if v})
        if parsed.storage_mb:  # no provider applies a disk quota: named so the plan does not suggest one
            env["storage_mb_recorded"] = parsed.storage_mb
        if parsed.gpus:
            env["gpus"] = parsed.gpus
        if parsed.verifier_mode not in (None, "shared"):  # see SEPARATE_NOTE
            env["verifier_environment_mode_not_applied"] = parsed.verifier_mode
        return env

    # -- attempt scope ---------------------------------------------------
    async def prepare_task(
        self, task: TaskSpec, env: EnvironmentSession, req: RunRequest, benchmark_plan: Any
    ) -> PreparedTask:
        parsed = self.task(task)
        problem = parsed.error or _unsupported(parsed)
        if problem:  # the docker provider refuses earlier; other providers end here
            raise RuntimeError(problem)
        made = await run_as_root(env, ["sh", "-c", 'mkdir -p "$@" && chmod 777 "$@"', "sh", *LOG_DIRS], timeout=60)
        if not made.ok:
            raise RuntimeError(f"cannot create {', '.join(LOG_DIRS)} in the task environment: {made.stderr[-500:]}")
        return PreparedTask(task_id=task.task_id, prompt=parsed.instruction)

    async def collect_artifacts(
        self,
        task: TaskSpec,
        prepared: PreparedTask,
        result: RunResult,
        env: EnvironmentSession,
        req: RunRequest,
        plan: ExecutionPlan,
    ) -> RunResult:
        folder = self._attempt_dir(task, plan)
        if folder is None:
            return result
        budget = self.artifact_limit_bytes
        copied: dict[str, Any] = {}
        for source in ("/logs/agent", "/logs/artifacts"):
            files, cut = await fetch_tree(env, source, budget)
            copied[source] = info = save_tree(files, folder / Path(source).name, budget, cut)
            budget = max(0, budget - int(info["bytes"]))
        return dataclasses.replace(result, metadata={**result.metadata, "copied": {"folder": str(folder), **copied}})

    async def evaluate(
        self,
        task: TaskSpec,
        prepared: PreparedTask,
        result: RunResult,
        req: RunRequest,
        plan: ExecutionPlan,
        env: EnvironmentSession | None = None,
    ) -> RunResult:
        if env is None:
            raise RuntimeError("the harbor verifier runs in a task environment; use evaluation mode 'reuse' or 'fresh'")
        parsed = self.task(task)
        tests = parsed.path / "tests"
        if not (tests / "test.sh").is_file():
            raise RuntimeError(f"{tests / 'test.sh'} does not exist: the task has no verifier")
        environ = {"TEST_DIR": "/tests", **expand_env(parsed.verifier_env, "verifier", parsed)}
        # A reward the agent wrote itself must not count, nor a /tests it made: the
        # verifier starts from an empty log folder and the task's own tests. The
        # tests go to a fresh folder first, and one exec swaps them in and runs
        # test.sh (one engine round trip less per attempt than a separate reset).
        staged = f"/.agentcompass-tests-{uuid.uuid4().hex[:12]}"
        await upload_tree(env, tests, staged)
        run = await run_as_root(
            env,
            ["sh", "-c", _SWAP_AND_VERIFY, "verifier", staged, VERIFIER_LOGS],
            timeout=parsed.verifier_timeout,
            environ=environ,
        )
        if run.exit_code == _SWAP_FAILED and _SWAP_MARK in run.stderr:
            raise RuntimeError(f"cannot prepare {VERIFIER_LOGS} and /tests for the verifier: {run.stderr[-500:]}")
        evidence: dict[str, Any] = {
            "exit_code": run.exit_code,
            "timed_out": run.timed_out,
            "duration": round(run.duration, 3),
            "stdout_tail": tail(run.stdout),
            "stderr_tail": tail(run.stderr),
        }
        limit = self.artifact_limit_bytes
        # One archive: the reward files and whatever else the verifier left (ctrf.json, logs).
        logs, cut = await fetch_tree(env, VERIFIER_LOGS, max(limit, REWARD_ROOM), REWARD_FILES)
        folder = self._attempt_dir(task, plan)
        if folder is not None:
            target = folder / "verifier"
            evidence["copied"] = save_tree(logs, target, limit, cut)
            target.mkdir(parents=True, exist_ok=True)
            (target / "test-stdout.txt").write_bytes(redact_bytes(run.stdout.encode("utf-8", "replace")))
            (target / "test-stderr.txt").write_bytes(redact_bytes(run.stderr.encode("utf-8", "replace")))
        metadata = {**result.metadata, "verifier": evidence}
        if run.timed_out:
            return self._error(result, metadata, f"the verifier timed out after {parsed.verifier_timeout:g}s", run)
        try:
            rewards = parse_rewards(logs.get("reward.txt"), logs.get("reward.json"), self.reward_key)
        except RewardError as exc:
            reason = str(exc)
            if b"\r\n" in (tests / "test.sh").read_bytes():  # a checkout made on Windows, say
                reason += f"; {tests / 'test.sh'} has Windows (CRLF) line endings, which bash cannot run"
            return self._error(result, metadata, reason, run)
        metadata["rewards"] = dict(rewards.values)
        metadata["reward_source"] = rewards.source
        return dataclasses.replace(result, score=rewards.score, metadata=metadata)

    @staticmethod
    def _error(result: RunResult, metadata: dict[str, Any], reason: str, run: Any) -> RunResult:
        output = (run.stderr.strip() or run.stdout.strip())[-500:]
        return dataclasses.replace(
            result,
            status=RunStatus.EVALUATION_ERROR,
            score=None,
            error=f"{reason} (verifier exit code {run.exit_code}); output tail:\n{output}",
            metadata=metadata,
        )

    def _attempt_dir(self, task: TaskSpec, plan: ExecutionPlan) -> Path | None:
        if self.run_dir is None:
            return None
        return self.run_dir / "details" / task.task_id / f"attempt-{plan.attempt_index}"

    # -- request end -----------------------------------------------------
    def aggregate_metrics(self, results: Sequence[RunResult], req: RunRequest) -> dict[str, Any]:
        metrics = super().aggregate_metrics(results, req)
        means: dict[str, MeanOf] = {}
        for r in results:
            for key, value in (r.metadata.get("rewards") or {}).items():
                means.setdefault(key, MeanOf()).add(float(value))
        if means:  # MeanOf: two rewards of 1e308 must not make the mean inf (then dropped as no number)
            metrics["rewards"] = {key: means[key].value() for key in sorted(means)}
        if any((self._parsed.get(r.task_id) or _NO_TASK).storage_mb for r in results):
            # Said once per request, not per task: no provider here sets a disk quota
            # (Docker can only on overlay2 over xfs with project quotas).
            metrics["storage_mb"] = STORAGE_NOTE
        modes = {m for r in results if (m := (self._parsed.get(r.task_id) or _NO_TASK).verifier_mode)} - {"shared"}
        if modes:
            metrics["verifier_environment_mode"] = SEPARATE_NOTE.format(modes=", ".join(sorted(modes)))
        return metrics


_NO_TASK = HarborTask(name="", path=Path())


def _unsupported(parsed: HarborTask) -> str | None:
    compose = parsed.compose_file
    if compose is not None:
        return f"{compose}: docker compose task environments are not supported yet"
    return None
