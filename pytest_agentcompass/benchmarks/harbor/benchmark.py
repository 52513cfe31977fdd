"""The ``harbor`` benchmark: a folder of Harbor / Terminal-Bench 2 task directories.

Per task: the container comes from the task's ``docker_image`` or its
``environment/Dockerfile`` (the provider builds it); the agent gets
``instruction.md``; then ``bash /tests/test.sh`` decides the score through
``/logs/verifier/reward.txt`` or ``reward.json``, in the verifier mode the
request chose (:mod:`.modes`: the agent's container, a snapshot of it, or a
verifier container of its own). What the runner does in a container goes
through the engine, never through the container's own tools
(:mod:`.session_io`); what the agent changed that a verifier relies on is
recorded as ``metadata["integrity"]`` (:mod:`.integrity`).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, Field, field_validator

from ...config import ConfigPath, ParamsModel
from ...vocabulary.errors import ComponentError
from ...vocabulary.types import EvaluationMode, ExecutionPlan, PreparedTask, RunResult, RunStatus, TaskSpec
from ..base import BaseBenchmark, MeanOf
from ..metrics import DEFAULT_METRICS, PASS_AT_K
from .discovery import files_digest, find_task_dirs, task_id_for
from .handoff import restore_artifacts, take_artifacts
from .modes import (
    RUNTIME_MODE,
    VerifierMode,
    check_request,
    evaluation_params,
    evaluation_policy,
    tests_baked_in,
    verifier_mode,
)
from .rewards import REWARD_MAX_BYTES, RewardError, check_range, parse_rewards
from .session_io import (
    LOG_DIRS,
    VERIFIER_LOGS,
    copy_folder,
    make_log_dirs,
    prepare_verifier,
    save_text,
    take_verifier_logs,
)
from .taskdir import TASK_FILE, HarborTask, expand_env, read_task
from .verifier import (
    agent_processes,
    changed_path_findings,
    exposed_secrets,
    listed,
    processes_left,
    run_verifier,
    tail,
    tests_findings,
)

if TYPE_CHECKING:
    from ...config import RunRequest
    from ...environments.base import EnvironmentSession

__all__ = ["HarborBenchmark", "HarborParams", "harbor_task"]


class HarborParams(ParamsModel):
    """``benchmark.params`` of ``harbor``."""

    #: A folder of task directories, or one task directory; relative to the config file's folder.
    path: ConfigPath
    #: The ``reward.json`` entry that is the score (default: ``reward``, else the mean).
    reward_key: str | None = None
    #: Bytes of ``/logs/agent`` + ``/logs/artifacts`` (and of ``/logs/verifier``) copied per attempt.
    artifact_limit_bytes: int = Field(default=20 * 1024 * 1024, ge=0)
    #: Seconds each copy out of a container may take (a stalled engine, a huge folder).
    artifact_time_limit: float = Field(default=60.0, gt=0)
    #: Where the verifier runs: ``shared``, ``snapshot`` or ``separate``; ``null``: see :mod:`.modes`.
    verifier_mode: VerifierMode | None = None
    #: Every reward must lie in ``[low, high]``; ``null``: no range.
    reward_range: tuple[float, float] | None = (0.0, 1.0)

    @field_validator("reward_range")
    @classmethod
    def _range(cls, value: tuple[float, float] | None) -> tuple[float, float] | None:
        if value is not None and not (math.isfinite(value[0]) and math.isfinite(value[1]) and value[0] <= value[1]):
            raise ValueError(f"reward_range must be two finite numbers [low, high] with low <= high, not {value!r}")
        return value


def harbor_task(task: TaskSpec) -> HarborTask:
    """The task directory behind a ``harbor`` TaskSpec, read again (cheap: two small files)."""
    return read_task(Path(str(task.metadata["path"])))


class HarborBenchmark(BaseBenchmark):
    """Runs Harbor task directories; see the module docstring."""

    params_model: ClassVar[type[BaseModel]] = HarborParams
    evaluation_environment_mode: ClassVar[EvaluationMode] = "reuse"
    #: What gates may name: the default metrics (``rewards``, the mean of each reward
    #: file's entry, is a mapping and no gate's number).
    metric_names: ClassVar[tuple[str, ...]] = (*DEFAULT_METRICS, PASS_AT_K)

    def __init__(
        self,
        path: str | Path,
        reward_key: str | None = None,
        artifact_limit_bytes: int = 20 * 1024 * 1024,
        artifact_time_limit: float = 60.0,
        verifier_mode: VerifierMode | None = None,
        reward_range: tuple[float, float] | None = (0.0, 1.0),
    ) -> None:
        super().__init__(
            path=str(path),
            reward_key=reward_key,
            artifact_limit_bytes=artifact_limit_bytes,
            artifact_time_limit=artifact_time_limit,
            verifier_mode=verifier_mode,
            reward_range=reward_range,
        )
        self.path = Path(path).expanduser()
        self.reward_key = reward_key
        self.artifact_limit_bytes = artifact_limit_bytes
        self.artifact_time_limit = artifact_time_limit
        self.verifier_mode: VerifierMode | None = verifier_mode
        self.reward_range = tuple(reward_range) if reward_range is not None else None
        self._parsed: dict[str, HarborTask] = {}

    def task(self, task: TaskSpec) -> HarborTask:
        """The parsed directory of ``task``, as loaded."""
        parsed = self._parsed.get(task.task_id)
        if parsed is None:
            parsed = self._parsed[task.task_id] = harbor_task(task)
        return parsed

    # -- request scope ---------------------------------------------------
    def load_tasks(self, req: RunRequest) -> Sequence[TaskSpec]:
        check_request(self.verifier_mode, req)
        root = self.path if self.path.is_absolute() else Path.cwd() / self.path
        if not root.is_dir():
            raise ComponentError(f"benchmark 'harbor': params.path {root} is not a folder")
        tasks: list[TaskSpec] = []
        where: dict[str, Path] = {}
        hidden: list[Path] = []
        for path in find_task_dirs(root, hidden):
            parsed = read_task(path)
            task_id = task_id_for(parsed.name)
            if task_id in where:
                first, second = (p.relative_to(root).as_posix() for p in (where[task_id], path))
                raise ComponentError(
                    f"benchmark 'harbor': two task directories have the id {task_id!r}: {first} and {second} "
                    f"(under {root}); a task's id is its directory's name, so rename one of them"
                )
            where[task_id] = path
            self._parsed[task_id] = parsed
            tasks.append(self._spec(task_id, parsed))
        if hidden:
            names = ", ".join(p.relative_to(root).as_posix() for p in hidden)
            warnings.warn(
                f"benchmark 'harbor': {len(hidden)} task folder(s) under {root} skipped because their names "
                f"start with '.' (hidden folders are not searched): {names}; rename them to run them",
                UserWarning,
                stacklevel=2,
            )
        return tasks

    @staticmethod
    def _spec(task_id: str, parsed: HarborTask) -> TaskSpec:
        return TaskSpec(
            task_id=task_id,
            question=parsed.instruction,
            category=parsed.category,
            tags=parsed.tags,
            aliases=(parsed.name,) if task_id != parsed.name else (),
            metadata={
                "path": str(parsed.path),
                "files": files_digest(parsed.path),
                "task_toml": parsed.config,
                **({"directory": parsed.name} if task_id != parsed.name else {}),
            },
            broken=parsed.error or _unsupported(parsed),
        )

    def adjust_plan(self, plan: ExecutionPlan, task: TaskSpec, req: RunRequest) -> ExecutionPlan:
        parsed = self.task(task)
        mode = verifier_mode(self.verifier_mode, req, parsed)
        timeouts = dict(plan.timeouts)
        if timeouts.get("run") is None and parsed.agent_timeout:
            timeouts["run"] = parsed.agent_timeout
        run_policy = plan.run_network_policy
        if req.environment.network.run is None and not parsed.allow_internet:
            run_policy = "disabled"
        environment = _environment(parsed)
        toml = parsed.path / TASK_FILE
        if not toml.is_file():  # its folder changed after the tasks were collected
            environment["unavailable"] = f"{toml} is gone since the task was collected: the task directory changed"
        environment["verifier_mode"] = mode
        if evaluation := evaluation_params(mode, parsed):
            environment["evaluation"] = evaluation
        return dataclasses.replace(
            plan,
            evaluation_environment_mode=RUNTIME_MODE[mode],
            timeouts=timeouts,
            run_network_policy=run_policy,
            evaluation_network_policy=evaluation_policy(mode, parsed, req, plan.evaluation_network_policy),
            environment=environment,
        )

    # -- attempt scope ---------------------------------------------------
    async def prepare_task(
        self, task: TaskSpec, env: EnvironmentSession, req: RunRequest, benchmark_plan: Any
    ) -> PreparedTask:
        parsed = self.task(task)
        await make_log_dirs(env)
        solution = parsed.path / "solution"
        reference = None
        if (solution / "solve.sh").is_file():
            reference = {
                "folder": str(solution),
                "target": "/solution",
                "command": ["bash", "/solution/solve.sh"],
                "env": expand_env(parsed.solution_env, "solution", parsed),
            }
        return PreparedTask(
            task_id=task.task_id,
            prompt=parsed.instruction,
            metadata={"reference_solution": reference or {"missing": str(solution / "solve.sh")}},
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
        parsed = self.task(task)
        mode: VerifierMode = plan.environment.get("verifier_mode", "shared")
        metadata = dict(result.metadata)
        findings: list[dict[str, Any]] = []
        notes: list[str] = []
        if mode != "shared":  # nothing the agent started may run on, while its files are read or after
            freeze = getattr(env, "freeze", None)
            if freeze is None:
                raise RuntimeError(f"verifier mode {mode!r} needs a provider that can stop a session (docker)")
            left = await processes_left(env)
            if left:  # by design; said, so a task that needed a service running is not a puzzle
                notes.append(
                    f"verifier mode {mode!r}: {len(left)} process(es) the agent left running were ended before "
                    f"verification and not carried over (no agent process runs in a {mode} verifier): "
                    f"{listed(left)}; a task whose tests need a service running must start it itself, or be "
                    "verified in mode 'shared'"
                )
            await freeze()
        if mode == "snapshot":  # the verifier will run on this very file system: what was changed matters
            findings += await changed_path_findings(env, getattr(env, "workdir", ""))
        budget = self.artifact_limit_bytes
        copied: dict[str, Any] = {}
        for source in ("/logs/agent", "/logs/artifacts"):
            copied[source] = info = await copy_folder(env, source, source.strip("/"), budget, self.artifact_time_limit)
            budget = max(0, budget - int(info["bytes"]))
        metadata["copied"] = copied
        if mode == "separate":
            metadata["transfer"] = await take_artifacts(
                env, parsed.artifacts, self.artifact_limit_bytes, self.artifact_time_limit
            )
            if not _anything_transferred(copied, metadata["transfer"]):
                declared = ", ".join(a.source for a in parsed.artifacts) or "none"
                notes.append(
                    "verifier mode 'separate': nothing of the agent's environment was copied to the verifier "
                    f"(/logs/artifacts held no files; the task's artifacts: {declared}); the verifier saw only "
                    "its own image"
                )
        if mode == "snapshot":
            await env.snapshot()  # type: ignore[attr-defined]
        if findings:
            metadata["integrity"] = findings
        if notes:
            metadata["notes"] = [*(metadata.get("notes") or []), *notes]
        return dataclasses.replace(result, metadata=metadata)

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
            raise RuntimeError("the harbor verifier runs in a container; use evaluation mode 'reuse' or 'fresh'")
        parsed = self.task(task)
        mode: VerifierMode = plan.environment.get("verifier_mode", "shared")
        tests = parsed.path / "tests"
        environ = {"TEST_DIR": "/tests", **expand_env(parsed.verifier_env, "verifier", parsed)}
        findings: list[dict[str, Any]] = list(result.metadata.get("integrity") or [])
        workdir = getattr(env, "workdir", "")
        if mode == "shared":  # before the runner stages anything: what the agent changed and left running
            findings += await changed_path_findings(env, workdir)
            findings += await agent_processes(env)
        if mode == "separate":
            await make_log_dirs(env, ("/logs/agent", "/logs/artifacts"))
            findings += await restore_artifacts(env, result.metadata, self.run_dir, workdir)
        findings += exposed_secrets(parsed.verifier_env, findings)
        # A reward the agent wrote itself must not count, nor a /tests it made: the
        # verifier starts from an empty log folder and the task's own tests.
        await prepare_verifier(env, None if tests_baked_in(mode, parsed) else tests)
        run = await run_verifier(env, parsed.verifier_timeout, environ, watch=mode == "shared")
        findings += run.findings
        if mode == "shared":
            findings += await tests_findings(env, tests)
        outcome = run.result
        evidence: dict[str, Any] = {
            "exit_code": outcome.exit_code,
            "timed_out": outcome.timed_out,
            "duration": round(outcome.duration, 3),
            "stdout_tail": tail(outcome.stdout),
            "stderr_tail": tail(outcome.stderr),
            "stdout": save_text("verifier/test-stdout.txt", outcome.stdout),
            "stderr": save_text("verifier/test-stderr.txt", outcome.stderr),
        }
        rewards, evidence["copied"] = await take_verifier_logs(env, self.artifact_limit_bytes, self.artifact_time_limit)
        metadata = {**result.metadata, "verifier": evidence}
        if findings:
            metadata["integrity"] = findings
        if outcome.timed_out:
            return self._error(result, metadata, f"the verifier timed out after {parsed.verifier_timeout:g}s", outcome)
        try:
            verdict = _rewards(rewards, self.reward_key, self.reward_range)
        except RewardError as exc:
            reason = str(exc)
            script = tests / "test.sh"
            if script.is_file() and b"\r\n" in script.read_bytes():  # a checkout made on Windows, say
                reason += f"; {script} has Windows (CRLF) line endings, which bash cannot run"
            return self._error(result, metadata, reason, outcome)
        metadata["rewards"] = dict(verdict.values)
        metadata["reward_source"] = verdict.source
        if verdict.ignored:
            metadata["rewards_ignored"] = list(verdict.ignored)
        return dataclasses.replace(result, score=verdict.score, metadata=metadata)

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

    # -- request end -----------------------------------------------------
    def aggregate_metrics(self, results: Sequence[RunResult], req: RunRequest) -> dict[str, Any]:
        metrics = super().aggregate_metrics(results, req)
        means: dict[str, MeanOf] = {}
        for r in results:
            for key, value in (r.metadata.get("rewards") or {}).items():
                means.setdefault(key, MeanOf()).add(float(value))
        if means:  # MeanOf: two rewards of 1e308 must not make the mean inf (then dropped as no number)
            metrics["rewards"] = {key: means[key].value() for key in sorted(means)}
        return metrics


def _rewards(found: Mapping[str, bytes | int | str], key: str | None, bounds: Any) -> Any:
    for name, value in found.items():
        if isinstance(value, int):
            raise RewardError(
                f"{VERIFIER_LOGS}/{name} is {value} bytes, too large to be a reward (at most {REWARD_MAX_BYTES})"
            )
        if isinstance(value, str):
            raise RewardError(f"{VERIFIER_LOGS}/{name} is {value}")
    txt, js = found.get("reward.txt"), found.get("reward.json")
    verdict = parse_rewards(txt if isinstance(txt, bytes) else None, js if isinstance(js, bytes) else None, key)
    check_range(verdict, bounds)
    return verdict


def _anything_transferred(copied: Mapping[str, Any], transfer: Mapping[str, Any]) -> bool:
    """Whether a separate verifier gets any file of the agent's environment."""
    if int((copied.get("/logs/artifacts") or {}).get("files") or 0):
        return True
    return any(int((a.get("copied") or {}).get("files") or 0) for a in transfer.get("artifacts") or [])


def _environment(parsed: HarborTask) -> dict[str, Any]:
    """Provider params for this task: its image or build, limits, and the image's WORKDIR."""
    # None: the image's WORKDIR; make_dirs: the log folders made as the container starts (no request of their own)
    # record_pids: the verifier tells what the agent left running from the container's own processes.
    env: dict[str, Any] = {"workdir": parsed.workdir, "make_dirs": list(LOG_DIRS), "record_pids": True}
    if parsed.docker_image:  # used when the engine has it; else the Dockerfile is built
        env["task_image"] = parsed.docker_image
    if (parsed.environment_dir / "Dockerfile").is_file():
        env["build"] = {"context": str(parsed.environment_dir), "timeout": parsed.build_timeout}
    elif not parsed.docker_image:  # the provider's words would blame its params, not the task
        missing = (
            parsed.environment_dir if not parsed.environment_dir.is_dir() else parsed.environment_dir / "Dockerfile"
        )
        env["no_image"] = (
            f"{missing} does not exist and {parsed.path / 'task.toml'} names no [environment] docker_image: "
            "the task has no environment to start"
        )
    limits = {"cpus": parsed.cpus, "memory_mb": parsed.memory_mb, "storage_mb": parsed.storage_mb}
    env.update({k: v for k, v in limits.items() if v})
    if parsed.gpus:
        env["gpus"] = parsed.gpus
    return env


def _unsupported(parsed: HarborTask) -> str | None:
    compose = parsed.compose_file
    if compose is not None:
        return f"{compose}: docker compose task environments are not supported yet"
    return None
