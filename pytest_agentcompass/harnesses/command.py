"""The ``command`` harness: runs an agent command line (an agent CLI) inside the task Environment."""

from __future__ import annotations

import os
import re
import shlex
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from ..environments.transfer import trusted
from ..models.client import guard_secrets
from ..vocabulary.artifacts import save_artifact
from ..vocabulary.redact import Redactor
from ..vocabulary.types import ExecResult, ExecutionPlan, PreparedTask, RunResult, RunStatus, TaskSpec
from ._params import parse_harness_params
from .base import BaseHarness

if TYPE_CHECKING:
    from ..config import RunRequest
    from ..environments.base import EnvironmentSession

__all__ = ["LOGS_DIR", "CommandHarness", "CommandParams", "collect_logs", "exec_facts", "make_logs_dir"]

Seconds = Annotated[float, Field(strict=True, gt=0)]
#: Where an agent CLI may leave its own logs; collected as artifacts (the Harbor convention).
LOGS_DIR = "/logs/agent"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def _problem(message: str) -> PydanticCustomError:
    # A custom error type: the message reaches the user without pydantic's "Value error, " prefix.
    return PydanticCustomError("agentcompass_command", message)


def _argv(value: str | list[str], what: str) -> list[str]:
    if isinstance(value, list):
        if not value:
            raise _problem(f"{what} is an empty list")
        return value
    try:
        argv = shlex.split(value)
    except ValueError as exc:
        raise _problem(f"cannot split {what} {value!r} like a shell would: {exc}") from None
    if not argv:
        raise _problem(f"{what} is empty")
    return argv


class CommandParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    #: The agent's command line: a list, or a string split like a shell would. ``{instruction}`` is the prompt.
    command: str | list[str]
    timeout: Seconds | None = None  # seconds for the agent command
    #: Extra environment variables; ``${VAR}`` values are expanded at load and masked as secrets.
    env: dict[str, str] = Field(default_factory=dict)
    #: Commands run before the agent, under the baseline network policy (strings run with ``sh -c``).
    setup: list[str | list[str]] = Field(default_factory=list)
    setup_timeout: Seconds = 600.0  # seconds per setup command
    #: Files under /logs/agent kept as artifacts, at most this many and this many bytes each.
    max_log_files: int = Field(default=50, ge=0)
    max_log_bytes: int = Field(default=1024 * 1024, ge=0)
    #: How the agent reaches the request's model: through the runner's gateway with a per-attempt
    #: token (the real key never enters the Environment), or ``direct`` with the real key and URL.
    model_access: Literal["gateway", "direct"] = "gateway"

    @field_validator("command")
    @classmethod
    def _splits(cls, value: str | list[str]) -> str | list[str]:
        _argv(value, "the command")
        return value

    @field_validator("setup")
    @classmethod
    def _setup_commands(cls, value: list[str | list[str]]) -> list[str | list[str]]:
        for index, command in enumerate(value):
            if isinstance(command, list) and not command:
                raise _problem(f"setup[{index}] is an empty list")
            if isinstance(command, str) and not command.strip():
                raise _problem(f"setup[{index}] is empty")
        return value


@dataclass
class _Session:
    setup: list[dict[str, Any]] = field(default_factory=list)
    failed: str | None = None


class CommandHarness(BaseHarness):
    """Runs ``params.command`` in the task Environment.

    The prompt reaches the command as ``{instruction}`` in its arguments, as
    ``$AGENTCOMPASS_PROMPT`` and in the file ``.agentcompass/prompt.txt``. The
    request's model (if any) is reached through the model gateway: the
    variables of :meth:`~pytest_agentcompass.gateway.Grant.env`
    (``$OPENAI_BASE_URL``, ``$OPENAI_API_KEY``, ``$ANTHROPIC_BASE_URL``, ...,
    ``$AGENTCOMPASS_MODEL``) name the gateway and a token valid for this
    attempt; with ``model_access: direct``, ``$OPENAI_BASE_URL`` and
    ``$OPENAI_API_KEY`` are the configured ones. Its stdout becomes
    ``RunResult.output``; stdout, stderr and the files it leaves under
    ``/logs/agent`` are saved as artifacts. A non-zero exit, a timeout or a
    failed setup command is an inference error.
    """

    id = "command"
    params_model = CommandParams
    needs_gateway = True

    def __init__(self, **params: Any) -> None:
        options = parse_harness_params(CommandParams, params, self.id)
        super().__init__(**options.model_dump())
        self.options = options
        self.argv = _argv(options.command, "the command")
        self.timeout = options.timeout
        self.needs_gateway = options.model_access == "gateway"

    # -- setup ------------------------------------------------------------------
    async def start_session(
        self, task: TaskSpec, prepared: PreparedTask, env: EnvironmentSession, req: RunRequest, plan: ExecutionPlan
    ) -> _Session:
        """Run the setup commands (before the run network policy applies: installs may need the network)."""
        session = _Session()
        for index, command in enumerate(self.options.setup):
            argv = ["sh", "-c", command] if isinstance(command, str) else command
            started = time.monotonic()
            done = await env.exec(argv, timeout=self.options.setup_timeout, cwd=prepared.workdir)
            session.setup.append(
                {
                    "command": command,
                    **exec_facts(done),
                    "duration_seconds": round(time.monotonic() - started, 4),
                }
            )
            if not done.ok:
                reason = "timed out" if done.timed_out else f"exited with {done.exit_code}"
                session.failed = f"setup command {index} {reason}: {tail(done.stderr.strip(), 500)}"
                break
        return session

    # -- the agent -----------------------------------------------------------------
    async def run(
        self,
        session: Any,
        task: TaskSpec,
        prepared: PreparedTask,
        env: EnvironmentSession,
        req: RunRequest,
        plan: ExecutionPlan,
    ) -> RunResult:
        setup = session.setup if isinstance(session, _Session) else []
        variables, redactor = _model_env(req) if self.options.model_access == "direct" else ({}, Redactor())
        metadata: dict[str, Any] = {"setup": setup} if setup else {}
        if isinstance(session, _Session) and session.failed:
            return _redacted(
                redactor,
                RunResult(task.task_id, status=RunStatus.INFERENCE_ERROR, error=session.failed, metadata=metadata),
            )
        await env.write_text(".agentcompass/prompt.txt", prepared.prompt)
        logs_dir = await make_logs_dir(env)
        variables.update(
            AGENTCOMPASS_PROMPT=prepared.prompt,
            AGENTCOMPASS_TASK_ID=task.task_id,
            AGENTCOMPASS_LOGS_DIR=logs_dir,
            **self.options.env,
        )
        argv = [arg.replace("{instruction}", prepared.prompt) for arg in self.argv]
        grant = None
        async with AsyncExitStack() as stack:
            if self.gateway is not None:
                grant = await stack.enter_async_context(
                    self.gateway.open_attempt(env, task.task_id, plan.attempt_index)
                )
                variables.update(grant.env())
            outcome = await env.exec(argv, timeout=self.timeout, env=variables, cwd=prepared.workdir)
        artifacts = {
            "stdout": save_artifact("agent/stdout.txt", redactor.text(outcome.stdout)),
            "stderr": save_artifact("agent/stderr.txt", redactor.text(outcome.stderr)),
            "logs": await self._collect_logs(env, redactor),
        }
        metadata["agent"] = exec_facts(outcome)
        kept = {k: v for k, v in artifacts.items() if v}
        if not outcome.ok:
            reason = "timed out" if outcome.timed_out else f"exited with {outcome.exit_code}"
            result = RunResult(
                task_id=task.task_id,
                output=_said(outcome.stdout, outcome),
                status=RunStatus.INFERENCE_ERROR,
                error=f"agent command {reason}: {tail(outcome.stderr.strip(), 500)}",
                artifacts=kept,
                metadata=metadata,
            )
        else:
            result = RunResult(
                task.task_id, output=_said(outcome.stdout.strip(), outcome), artifacts=kept, metadata=metadata
            )
        if grant is not None:
            result = grant.finish(result)
        return _redacted(redactor, result)

    async def _collect_logs(self, env: EnvironmentSession, redactor: Redactor) -> list[str]:
        return await collect_logs(env, redactor, self.options.max_log_files, self.options.max_log_bytes)


async def collect_logs(
    env: EnvironmentSession, redactor: Redactor, max_files: int, max_bytes: int, folder: str = "logs/agent"
) -> list[str]:
    """Save the files under ``/<folder>`` (at most ``max_files``, ``max_bytes`` each) as artifacts
    ``agent/logs/<path under the folder>``; returns their paths relative to the run directory."""
    if not max_files:
        return []
    access = trusted(env)
    if access is not None:  # a container: through the engine, never the container's own sh and find
        return await _collect_through_engine(access, redactor, max_files, max_bytes, folder)
    # cwd "/" and a relative path: the local provider maps both into its workspace.
    listing = await env.exec(
        ["sh", "-c", f"cd {shlex.quote(folder)} 2>/dev/null && find . -type f"], timeout=60, cwd="/"
    )
    saved: list[str] = []
    for name in sorted(line[2:] for line in listing.stdout.splitlines() if line.startswith("./")):
        if len(saved) >= max_files:
            break
        # Only the part kept is read: a huge (or sparse) log costs max_bytes, not its size.
        data, _ = await env.read_head(f"/{folder}/{name}", max_bytes)
        path = _save_log(redactor, name, data)
        if path:
            saved.append(path)
    return saved


#: Seconds the copy of an agent's logs out of a container may take.
LOG_COPY_SECONDS = 60.0


async def _collect_through_engine(
    access: Any, redactor: Redactor, max_files: int, max_bytes: int, folder: str
) -> list[str]:
    """The logs of a container, streamed from the engine's archive of the folder: the agent's tools
    never run, any name arrives whole (a newline in it too), at most ``max_files`` files of at most
    ``max_bytes`` each are kept; a file larger than what is left of ``max_files * max_bytes`` is not
    read (the copy stops there), and the whole copy takes at most :data:`LOG_COPY_SECONDS`."""
    saved: list[str] = []
    seen = 0

    def skip(name: str) -> bool:
        nonlocal seen
        seen += 1
        return seen > max_files

    def save(name: str, handle: Any, size: int) -> int:
        data = handle.read(min(size, max_bytes))
        path = _save_log(redactor, name, data)
        if path:
            saved.append(path)
        return len(data)

    await access.copy_out(f"/{folder.strip('/')}", save, max_files * max_bytes, LOG_COPY_SECONDS, skip)
    return saved


def _save_log(redactor: Redactor, name: str, data: bytes) -> str | None:
    """Keep one log file as ``agent/logs/<name made safe>`` (redacted when it is text)."""
    if redactor:
        try:
            data = redactor.text(data.decode("utf-8")).encode("utf-8")
        except UnicodeDecodeError:
            pass  # binary: saved as it is
    safe = "/".join(_UNSAFE.sub("_", part).lstrip(".-_") or "_" for part in name.split("/"))
    return save_artifact(f"agent/logs/{safe}", data)


async def make_logs_dir(env: EnvironmentSession) -> str:
    """Create /logs/agent and return its real path (inside the workspace for ``local``)."""
    made = await env.exec(["sh", "-c", "mkdir -p logs/agent && cd logs/agent && pwd"], timeout=60, cwd="/")
    return made.stdout.strip() or LOGS_DIR


def _model_env(req: RunRequest) -> tuple[dict[str, str], Redactor]:
    """The request's model as the variables agent CLIs read, and a redactor for its key."""
    model = req.model
    if model is None:
        return {}, Redactor()
    params = model.params
    variables = {"AGENTCOMPASS_MODEL": model.id}
    base_url = params.get("base_url") or os.environ.get("OPENAI_BASE_URL")
    api_key = params.get("api_key") or os.environ.get("OPENAI_API_KEY")
    if isinstance(base_url, str):
        variables["OPENAI_BASE_URL"] = base_url
    if isinstance(api_key, str):
        variables["OPENAI_API_KEY"] = api_key
        guard_secrets(api_key)
    return variables, Redactor()


def exec_facts(done: ExecResult) -> dict[str, Any]:
    """A command's exit and the tails of its output; what the provider did not capture is said."""
    facts: dict[str, Any] = {
        "exit_code": done.exit_code,
        "timed_out": done.timed_out,
        "stdout_tail": tail(done.stdout, 2000),
        "stderr_tail": tail(done.stderr, 2000),
    }
    for name, cut, omitted in (
        ("stdout", done.stdout_truncated, done.stdout_omitted),
        ("stderr", done.stderr_truncated, done.stderr_omitted),
    ):
        if cut:
            count = f"{omitted} characters" if omitted is not None else "what came"
            facts[f"{name}_cut"] = f"{count} past the environment's output_limit were not captured"
    return facts


def tail(text: str, limit: int) -> str:
    """The last ``limit`` characters of ``text``, saying how many came before."""
    if len(text) <= limit:
        return text
    return f"[... {len(text) - limit} characters before ...]\n{text[-limit:]}"


def _said(stdout: str, done: ExecResult) -> str:
    """The agent's output, ending with what the provider did not capture of it (its head is kept)."""
    if not done.stdout_truncated:
        return stdout
    count = f"{done.stdout_omitted} more characters" if done.stdout_omitted is not None else "more"
    return f"{stdout}\n[... {count} of stdout not captured: the environment's output_limit ...]"


def _redacted(redactor: Redactor, result: RunResult) -> RunResult:
    """A key taken from the process environment is no ``${VAR}``: mask it here."""
    if not redactor:
        return result
    return RunResult(
        task_id=result.task_id,
        output=redactor.apply(result.output),
        status=result.status,
        error=redactor.apply(result.error),
        artifacts=redactor.apply(dict(result.artifacts)),
        metadata=redactor.apply(dict(result.metadata)),
    )
