"""The ``openai`` harness: one chat completion per task, and the base of model-calling harnesses."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, cast

from pydantic import BaseModel, ConfigDict

from ..models.client import ChatModel, ModelCallError, guard_secrets, require_openai
from ..models.settings import ModelSettings, resolve_model
from ..models.trajectory import Trajectory
from ..vocabulary.artifacts import save_artifact
from ..vocabulary.errors import PreflightError
from ..vocabulary.redact import Redactor
from ..vocabulary.types import ExecutionPlan, PreparedTask, RunResult, RunStatus, TaskSpec
from ._params import parse_harness_params
from .base import BaseHarness

if TYPE_CHECKING:
    from ..config import RunRequest
    from ..environments.base import EnvironmentSession

__all__ = ["ModelHarness", "OpenAIChatHarness", "OpenAIChatParams"]

TRAJECTORY_FILE = "trajectory.json"


class ModelHarness(BaseHarness):
    """A harness that calls the request's model through an OpenAI-compatible endpoint.

    One :class:`ChatModel` per request (this instance), shared by its tasks;
    its client is closed by :meth:`aclose` when the request ends.
    """

    params_model: ClassVar[type[BaseModel]]
    model_settings: ClassVar[type[Any] | None] = ModelSettings

    def __init__(self, **params: Any) -> None:
        validated = parse_harness_params(self.params_model, params, self.id)
        super().__init__(**validated.model_dump())
        self.config = validated
        self._model: ChatModel | None = None
        self._redactor = Redactor()

    def preflight(self, req: RunRequest) -> None:
        require_openai()
        resolved = resolve_model(req.model, f"harness {self.id!r}")
        self._model = ChatModel(resolved)
        # The key (and any header value) may come from the process environment
        # rather than a ${VAR}: mask it everywhere, including what this harness returns.
        guard_secrets(resolved.api_key, *resolved.settings.headers.values())

    def model(self, req: RunRequest, task: TaskSpec) -> ChatModel | RunResult:
        """The request's model; a result saying why not when it is unusable.

        Under xdist a worker skips the request preflight, so the checks run
        here on first use; their failure cannot be fixed by a retry.
        """
        if self._model is None:
            try:
                self.preflight(req)
            except PreflightError as exc:
                return RunResult(
                    task.task_id, status=RunStatus.INFERENCE_ERROR, error=str(exc), metadata={"retryable": False}
                )
        assert self._model is not None
        return self._model

    async def aclose(self) -> None:
        if self._model is not None:
            await self._model.aclose()

    # -- results ---------------------------------------------------------------
    def trajectory(self, model: ChatModel, task: TaskSpec) -> Trajectory:
        return Trajectory(harness=self.id, model=model.name, endpoint=model.resolved.endpoint, task_id=task.task_id)

    def finish(
        self,
        model: ChatModel,
        task: TaskSpec,
        trajectory: Trajectory,
        output: str | None,
        error: ModelCallError | None = None,
        **metadata: Any,
    ) -> RunResult:
        """The run result, with usage, the trajectory file and the last turns."""
        settings = model.resolved.settings
        trajectory.usage.price(settings.input_price_per_million, settings.output_price_per_million)
        if error is not None:
            trajectory.error(error.message)
            trajectory.stop_reason = trajectory.stop_reason or "error"
        path = self.save_trajectory(trajectory)
        meta: dict[str, Any] = {
            "usage": trajectory.usage.to_dict(),
            "model": model.name,
            "stop_reason": trajectory.stop_reason,
            "turns": trajectory.turns,
            "last_turns": trajectory.tail(),
            **metadata,
        }
        artifacts = {"trajectory": path} if path else {}
        if error is not None:
            meta["error_type"] = error.error_type  # the failure's class, for retry policies
            if not error.retryable:
                meta["retryable"] = False
            if error.kind:  # from the client's exception class: how the retry policy sees it
                meta["error_kind"] = error.kind
            result = RunResult(
                task_id=task.task_id,
                output=output,
                status=RunStatus.INFERENCE_ERROR,
                error=error.message,
                artifacts=artifacts,
                metadata=meta,
            )
        else:
            result = RunResult(task_id=task.task_id, output=output, artifacts=artifacts, metadata=meta)
        return self.redact(result)

    def save_trajectory(self, trajectory: Trajectory) -> str | None:
        # The run store masks config and runtime secrets in what it writes.
        return save_artifact(TRAJECTORY_FILE, trajectory.to_dict())

    def redact(self, result: RunResult) -> RunResult:
        """Mask secrets in the result, which the pytest report shows as it is."""
        redactor = self._redactor
        if not redactor:
            return result
        if not redactor.may_occur_in([result.output, result.error, result.metadata]):
            return result  # the common case: no deep copy
        return RunResult(
            task_id=result.task_id,
            output=self._redactor.apply(result.output),
            score=result.score,
            status=result.status,
            error=self._redactor.apply(result.error),
            artifacts=self._redactor.apply(dict(result.artifacts)),
            metadata=self._redactor.apply(dict(result.metadata)),
        )


class OpenAIChatParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    #: Sent before the task prompt; none by default.
    system_prompt: str | None = None


class OpenAIChatHarness(ModelHarness):
    """Sends the prepared prompt as one user message; the answer is the output."""

    id = "openai"
    params_model = OpenAIChatParams

    async def run(
        self,
        session: Any,
        task: TaskSpec,
        prepared: PreparedTask,
        env: EnvironmentSession,
        req: RunRequest,
        plan: ExecutionPlan,
    ) -> RunResult:
        model = self.model(req, task)
        if isinstance(model, RunResult):
            return model
        trajectory = self.trajectory(model, task)
        system = cast(OpenAIChatParams, self.config).system_prompt
        if system:
            trajectory.message({"role": "system", "content": system})
        trajectory.message({"role": "user", "content": prepared.prompt})
        try:
            reply = await model.complete(trajectory.messages())
        except ModelCallError as exc:
            return self.finish(model, task, trajectory, None, exc)
        trajectory.model_call(reply)
        if reply.finish_reason == "length":  # scored as it came, but said: the model ran out of tokens
            trajectory.stop_reason = "truncated"
            note = "the model's answer was truncated at its token limit (finish_reason: length)"
            return self.finish(model, task, trajectory, (reply.content or "").strip(), answer_cut=note)
        trajectory.stop_reason = "answered"
        return self.finish(model, task, trajectory, (reply.content or "").strip())
