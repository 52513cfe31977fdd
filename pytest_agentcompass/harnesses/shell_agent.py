"""The ``shell-agent`` harness: a model in a loop with one tool that runs shell commands.

Each turn sends the conversation with the ``shell`` tool; every tool call is
run in the task Environment through ``env.exec`` and its result goes back as
the tool message. The loop ends when the model answers without a tool call,
at ``max_turns``, at the token budget, or shortly before the plan's run
timeout (so the task is still evaluated on what the agent did).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any, cast

from pydantic import BaseModel, ConfigDict, Field

from ..models.client import ChatModel, ModelCallError
from ..models.trajectory import Trajectory
from ..vocabulary.types import ExecResult, ExecutionPlan, PreparedTask, RunResult, TaskSpec
from .openai_chat import ModelHarness

if TYPE_CHECKING:
    from ..config import RunRequest
    from ..environments.base import EnvironmentSession

__all__ = ["DEFAULT_SYSTEM_PROMPT", "SHELL_TOOL", "ShellAgentHarness", "ShellAgentParams", "format_tool_output"]

DEFAULT_SYSTEM_PROMPT = """\
You are an autonomous agent working in a Linux shell environment to complete a task.
Use the `shell` tool to run commands: inspect files, edit them, run programs and tests.
Each call runs in a fresh shell in the task's working directory; state lives in files, not in
shell variables. Work step by step and check your results. Do not ask questions: nobody will answer.
When the task is complete, reply with a short summary and no tool call."""

#: The one tool, in OpenAI's function-tool format (documented in docs/api.md).
SHELL_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "shell",
        "description": (
            "Run a shell command (sh -c) in the task environment and return its exit code, "
            "stdout and stderr. Long output is cut in the middle."
        ),
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "The command line to run."}},
            "required": ["command"],
            "additionalProperties": False,
        },
    },
}


class ShellAgentParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    max_turns: int = Field(default=30, ge=1)  # model calls per task
    max_total_tokens: int | None = Field(default=None, ge=1)  # stop once the task used this many tokens
    command_timeout: float = Field(default=120.0, gt=0)  # seconds per shell command
    output_limit: int = Field(default=10_000, ge=200)  # characters of a tool result fed back (head + tail)
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    shell: list[str] = Field(default_factory=lambda: ["sh", "-c"], min_length=1)
    workdir: str | None = None  # default: the prepared task's workdir, else the Environment's


class ShellAgentHarness(ModelHarness):
    """A tool-using agent loop over any OpenAI-compatible chat endpoint."""

    id = "shell-agent"
    params_model = ShellAgentParams

    async def run(
        self,
        session: Any,
        task: TaskSpec,
        prepared: PreparedTask,
        env: EnvironmentSession,
        req: RunRequest,
        plan: ExecutionPlan,
    ) -> RunResult:
        options = cast(ShellAgentParams, self.config)
        model = self.model(req, task)
        if isinstance(model, RunResult):
            return model
        trajectory = self.trajectory(model, task)
        trajectory.message({"role": "system", "content": options.system_prompt})
        trajectory.message({"role": "user", "content": prepared.prompt})
        workdir = options.workdir or prepared.workdir
        deadline = _deadline(plan.timeouts.get("run"))
        answer: str | None = None
        budget = asyncio.timeout_at(deadline)
        try:
            async with budget:
                answer = await self._loop(model, trajectory, env, options, workdir)
        except TimeoutError:
            if not budget.expired():  # not our deadline: someone else's timeout
                trajectory.stop_reason = "interrupted"
                self.save_trajectory(trajectory)
                raise
            trajectory.stop_reason = "timeout"
        except ModelCallError as exc:
            return self.finish(model, task, trajectory, answer, exc)
        except BaseException:
            # Cancelled (Ctrl-C, the deadline) or the Environment failed: keep what happened.
            trajectory.stop_reason = trajectory.stop_reason or "interrupted"
            self.save_trajectory(trajectory)
            raise
        return self.finish(model, task, trajectory, answer)

    async def _loop(
        self,
        model: ChatModel,
        trajectory: Trajectory,
        env: EnvironmentSession,
        options: ShellAgentParams,
        workdir: str | None,
    ) -> str | None:
        messages = trajectory.messages()
        while True:
            if trajectory.turns >= options.max_turns:
                trajectory.stop_reason = "max_turns"
                return None
            if options.max_total_tokens is not None and trajectory.usage.total_tokens >= options.max_total_tokens:
                trajectory.stop_reason = "token_budget"
                return None
            reply = await model.complete(messages, tools=[SHELL_TOOL])
            messages.append(trajectory.model_call(reply))
            if not reply.tool_calls:
                trajectory.stop_reason = "answered"
                return (reply.content or "").strip()
            for call in reply.tool_calls:
                message, facts = await self._tool(call.id, call.name, call.arguments, env, options, workdir)
                trajectory.tool_result(message, **facts)
                messages.append(message)

    async def _tool(
        self,
        call_id: str,
        name: str,
        arguments: str,
        env: EnvironmentSession,
        options: ShellAgentParams,
        workdir: str | None,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Run one tool call; a malformed one is answered with an error the model can act on."""
        facts: dict[str, Any] = {"tool_call_id": call_id, "name": name}
        command, problem = _parse_arguments(name, arguments)
        if problem is not None:
            facts["error"] = problem
            return {"role": "tool", "tool_call_id": call_id, "content": f"error: {problem}"}, facts
        assert command is not None
        started = time.monotonic()
        result = await env.exec([*options.shell, command], timeout=options.command_timeout, cwd=workdir)
        content, cut = format_tool_output(result, options.output_limit, options.command_timeout)
        facts.update(
            command=command,
            exit_code=result.exit_code,
            timed_out=result.timed_out,
            truncated=cut or result.stdout_truncated or result.stderr_truncated,
            duration_seconds=round(time.monotonic() - started, 4),
        )
        return {"role": "tool", "tool_call_id": call_id, "content": content}, facts


def _parse_arguments(name: str, arguments: str) -> tuple[str | None, str | None]:
    """``(command, None)`` or ``(None, what is wrong)``."""
    if name != SHELL_TOOL["function"]["name"]:
        return None, f'unknown tool {name!r}; the only tool is \'shell\' with arguments {{"command": "..."}}'
    try:
        value = json.loads(arguments or "{}")
    except json.JSONDecodeError as exc:
        return None, f'the arguments are not valid JSON ({exc.msg} at {exc.pos}); send {{"command": "..."}}'
    command = value.get("command") if isinstance(value, dict) else None
    if not isinstance(command, str) or not command.strip():
        return None, 'the arguments must be an object with a non-empty string "command"'
    return command, None


def format_tool_output(result: ExecResult, limit: int, timeout: float) -> tuple[str, bool]:
    """The tool message text and whether anything was left out.

    Past ``limit`` characters each stream is cut in its middle (its first lines
    say what the command did, its last lines how it ended), under its own
    ``stdout:``/``stderr:`` header: a cut across both streams lost the second
    one's header. A short stream keeps its whole text, the long one gets the
    rest. Every omission is marked where it happened with its exact size in
    characters: the cut, and what the Environment itself dropped past its
    output limit (the end of a stream).
    """
    status = f"exit code: {result.exit_code}"
    if result.timed_out:
        status += f" (killed: the command exceeded its {timeout:g}s timeout)"
    streams = [
        (name, output, truncated, omitted)
        for name, output, truncated, omitted in (
            ("stdout", result.stdout, result.stdout_truncated, result.stdout_omitted),
            ("stderr", result.stderr, result.stderr_truncated, result.stderr_omitted),
        )
        if output or truncated
    ]
    room = limit - len(status) - sum(len(f"\n{name}:\n") for name, *_ in streams)
    sizes = _shares([len(output) for _, output, _, _ in streams], max(room, 0))
    text, cut = status, False
    for (name, output, truncated, omitted), size in zip(streams, sizes, strict=True):
        body = output
        if len(output) > size:
            half = size // 2
            body = output[:half] + _marker(len(output) - 2 * half, 0) + output[len(output) - half :]
            cut = True
        if truncated:
            body += _marker(omitted, 0)
            cut = True
        text += f"\n{name}:\n{body}"
    return text, cut


def _shares(lengths: list[int], room: int) -> list[int]:
    """Characters each stream keeps of ``room``: the shorter whole, the rest split evenly."""
    shares = [0] * len(lengths)
    left = room
    for count, index in enumerate(sorted(range(len(lengths)), key=lambda i: lengths[i])):
        shares[index] = min(lengths[index], left // (len(lengths) - count))
        left -= shares[index]
    return shares


def _marker(omitted: int | None, at_least: int) -> str:
    count = f"{omitted}" if omitted is not None else (f"at least {at_least}" if at_least else "more")
    return f"\n[... {count} characters omitted ...]\n"


def _deadline(run_timeout: float | None) -> float | None:
    """When the agent stops by itself: a little before the run stage's own timeout fires."""
    if run_timeout is None:
        return None
    margin = min(5.0, run_timeout * 0.1)
    return asyncio.get_running_loop().time() + run_timeout - margin
