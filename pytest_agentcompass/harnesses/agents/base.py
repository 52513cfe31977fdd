"""The base of every agent CLI harness: fetch once, install once per image, configure, run, collect.

A built-in agent is a short declarative subclass of :class:`AgentHarness`:
its pinned ``version``, the model API it speaks (``protocol``), the packages
to fetch (:meth:`~AgentHarness.packages`), how to install them into
``$PREFIX`` (:meth:`~AgentHarness.install_script`), how to run it headless
(:meth:`~AgentHarness.command`, :meth:`~AgentHarness.environment`,
:meth:`~AgentHarness.files`) and how to read its own report
(:meth:`~AgentHarness.parse_report`). Everything else is here:

- **preflight** fills the package cache on the host (the user's npm/pip
  registries, hashes checked), or finds it filled (no registry needed);
- **adjust_plan** puts the install recipe into ``plan.environment``, so the
  provider starts the task from an image that has the agent (the docker
  provider makes it once per task image: :mod:`...environments.docker_derived`);
- **run** opens the attempt's grant on the request's model gateway (a token
  valid for this attempt only, the gateway's URL as the container reaches it:
  the real key never enters the Environment, and every call is counted),
  writes the agent's settings into its own folder under ``/logs/agent``, runs
  it in the task's workdir until shortly before the plan's ``run`` timeout,
  saves its stdout, stderr and that folder as artifacts, and returns its exit
  code with the gateway's usage and trajectory; a non-zero exit or a timeout
  is an inference error with the output's tail.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import Field

from ...config import ConfigPath, ParamsModel
from ...models.usage import Usage
from ...vocabulary.agent_install import MARKER, AgentInstall
from ...vocabulary.artifacts import save_artifact
from ...vocabulary.errors import PreflightError, SessionError
from ...vocabulary.redact import Redactor
from ...vocabulary.types import ExecutionPlan, PreparedTask, RunResult, RunStatus, TaskSpec
from .._params import parse_harness_params
from ..base import BaseHarness
from ..command import LOGS_DIR, collect_logs, exec_facts, make_logs_dir
from ..shell_agent import _deadline
from .cache import FetchError, PackageCache, PackageSource, default_cache_dir, ensure_packages

if TYPE_CHECKING:
    from ...config import RunRequest
    from ...environments.base import EnvironmentSession
    from ...models.ledger import Protocol

__all__ = [
    "AgentHarness", "AgentParams", "AgentReport", "AgentRun", "ModelEndpoint", "event_error", "json_lines", "untar",
]  # fmt: skip

Seconds = Annotated[float, Field(strict=True, gt=0)]
#: Characters of the agent's output quoted in an error.
_TAIL = 1500


class AgentParams(ParamsModel):
    """``harness.params`` every agent CLI takes."""

    #: The agent's version; default: the one the harness pins (``<Harness>.version``).
    version: str | None = Field(default=None, min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
    #: Where fetched packages are kept (default ``~/.cache/pytest-agentcompass/agents``).
    cache_dir: ConfigPath | None = None
    #: Seconds the agent may run; default: until shortly before the plan's ``run`` timeout.
    timeout: Seconds | None = None
    #: Seconds the install may take in its container (once per task image).
    install_timeout: Seconds = 900.0
    #: Extra environment variables for the agent (``${VAR}`` values are secrets).
    env: dict[str, str] = Field(default_factory=dict)
    #: Extra command-line arguments, appended to the agent's own.
    args: list[str] = Field(default_factory=list)
    #: Files of the agent's own folder (sessions, logs) kept as artifacts.
    max_log_files: int = Field(default=200, ge=0)
    max_log_bytes: int = Field(default=5 * 1024 * 1024, ge=0)


@dataclass(frozen=True)
class ModelEndpoint:
    """The model as the agent inside the Environment reaches it: the gateway, in the agent's API.

    :param base_url: OpenAI's APIs: up to and including ``/v1``; Anthropic's and
        Gemini's: the root (their clients add ``/v1/messages``, ``/v1beta/models/...``).
    :param api_key: The attempt's token (refused once the attempt ended), never the real key.
    """

    protocol: Protocol
    base_url: str
    model: str
    api_key: str = field(repr=False)


@dataclass(frozen=True)
class AgentRun:
    """What one run of an agent is built from (handed to the subclass's hooks)."""

    prompt: str
    endpoint: ModelEndpoint
    #: Where the agent is installed (its files under ``bin/`` and wherever its script put them).
    prefix: str
    #: The agent's own folder for settings, sessions and logs (under ``/logs/agent``, kept as artifacts).
    home: str
    version: str
    params: AgentParams

    @property
    def model(self) -> str:
        return self.endpoint.model

    def bin(self, name: str) -> str:
        return f"{self.prefix}/bin/{name}"


@dataclass
class AgentReport:
    """What the agent said about its own run: token usage (a cross-check), its final answer, and why it
    failed when its report says (an error event of a JSON-lines report: the task's error quotes it)."""

    usage: Usage | None = None
    answer: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def json_lines(text: str) -> Iterator[dict[str, Any]]:
    """The JSON objects of a JSON-lines report, other lines (warnings, progress) skipped."""
    for line in text.splitlines():
        if line.startswith("{"):
            value = json.loads(line)
            if isinstance(value, dict):
                yield value


def event_error(event: dict[str, Any]) -> str | None:
    """The message of an error event of a JSON-lines report, wherever the agent puts it
    (``message``, ``error.message``, ``error.data.message``, else the error's name)."""
    error = event.get("error")
    for value in (
        event.get("message"),
        error.get("message") if isinstance(error, dict) else error,
        (error.get("data") or {}).get("message") if isinstance(error, dict) else None,
        error.get("name") if isinstance(error, dict) else None,
    ):
        if isinstance(value, str) and value.strip():
            return value
    return None


def untar(tarball: str, *members: str, into: str = "bin", strip: int = 1) -> str:
    """A shell line extracting ``members`` of ``$PKGS/<tarball>`` into ``$PREFIX/<into>`` (no members: all of it).

    Members are file names: BusyBox's ``tar`` (the only one of some images) matches them
    exactly, where GNU tar also takes a folder's name for everything under it. The flags
    used (``-xzf``, ``-C``, ``--strip-components``) are ones both have.
    """
    names = " ".join(shlex.quote(m) for m in members)
    return (
        f'mkdir -p "$PREFIX/{into}" && tar -xzf "$PKGS/{tarball}" -C "$PREFIX/{into}" '
        f"--strip-components={strip} {names}"
    ).rstrip()


@dataclass
class _Session:
    deadline: float | None
    install: dict[str, Any] | None


class AgentHarness(BaseHarness):
    """An agent CLI run inside the task Environment (see the module docstring)."""

    id: ClassVar[str] = ""
    #: The version installed unless ``params.version`` says otherwise: pinned, agents change weekly.
    version: ClassVar[str] = ""
    #: The model API the agent speaks (the gateway needs an upstream for it).
    protocol: ClassVar[Protocol] = "openai_chat"
    needs_gateway = True
    #: Its entry point, which the install script puts in ``$PREFIX/bin``.
    binary: ClassVar[str] = ""
    #: Arguments that make it say its version: run at the end of the install, to prove it runs there.
    check_args: ClassVar[tuple[str, ...]] = ("--version",)
    #: A file in the agent's folder to read its report from, instead of its stdout.
    report_file: ClassVar[str | None] = None
    #: Where the agent writes why it failed, when its report does not say: a failed run's error
    #: quotes the tail of this stream (the other one when this one is empty).
    error_stream: ClassVar[Literal["stdout", "stderr"]] = "stderr"
    params_model: ClassVar[type[ParamsModel]] = AgentParams

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.gateway_protocols = frozenset({cls.protocol})

    def __init__(self, **params: Any) -> None:
        options: Any = parse_harness_params(self.params_model, params, self.id)
        super().__init__(**options.model_dump())
        self.options = options
        self.agent_version: str = options.version or self.version
        self._install: AgentInstall | None = None

    # -- what a subclass declares ---------------------------------------------
    def packages(self, version: str) -> list[PackageSource]:
        """What to fetch on the host (npm packages, Python wheels)."""
        raise NotImplementedError(f"{type(self).__name__} must declare its packages")

    def install_script(self, version: str) -> str:
        """``sh`` lines that install from ``$PKGS`` into ``$PREFIX`` (as root, offline, in ``/``)."""
        raise NotImplementedError(f"{type(self).__name__} must declare its install script")

    def command(self, run: AgentRun) -> list[str]:
        """The headless command line (the prompt an argument of it)."""
        raise NotImplementedError(f"{type(self).__name__} must declare its command")

    def environment(self, run: AgentRun) -> dict[str, str]:
        """Environment variables of the agent's process."""
        return {}

    def files(self, run: AgentRun) -> dict[str, str]:
        """Settings files to write before the run: absolute path -> text."""
        return {}

    def parse_report(self, text: str) -> AgentReport:
        """Read the agent's own report (its stdout, or :attr:`report_file`)."""
        return AgentReport()

    # -- once per request ---------------------------------------------------------
    async def preflight(self, req: RunRequest) -> None:
        if req.model is None:
            raise PreflightError(
                f"harness {self.id!r} needs a model: add `model: {{id: <model name>, params: {{...}}}}` to the request"
            )
        await self.recipe()

    async def recipe(self) -> AgentInstall:
        """The install recipe, its files fetched into the cache (once per process)."""
        if self._install is None:
            options = self.options
            root = Path(options.cache_dir) if options.cache_dir else default_cache_dir()
            version = self.agent_version
            try:
                cached = await ensure_packages(PackageCache(root), self.id, version, self.packages(version))
            except FetchError as exc:
                from . import AGENTS

                fill = "a run there fetches them"
                if self.id in AGENTS:  # the command knows the built-in agents
                    fill = f"`python -m pytest_agentcompass agents fetch {self.id}@{version}"
                    fill += f" --cache-dir {root}`" if options.cache_dir else "`"
                raise PreflightError(
                    f"harness {self.id!r}: the packages of {self.id} {version} are not in the cache at {root} "
                    f"and could not be fetched: {exc}\nFill the cache where a registry is reachable ({fill}); "
                    f"without a registry, copy a cache folder filled there to {root} "
                    "(or point harness.params.cache_dir at it)"
                ) from None
            self._install = AgentInstall(
                self.id, version, str(cached.path), cached.digest, self._script(version),
                timeout=options.install_timeout,
            )  # fmt: skip
        return self._install

    def _script(self, version: str) -> str:
        """The subclass's install, then its binary run once: an agent that cannot start fails its install."""
        check = " ".join([f'"$PREFIX/bin/{self.binary}"', *(shlex.quote(a) for a in self.check_args)])
        return f"{self.install_script(version).rstrip()}\n{check}"

    async def adjust_plan(self, plan: ExecutionPlan, task: TaskSpec, req: RunRequest) -> ExecutionPlan:
        recipe = await self.recipe()
        return dataclasses.replace(plan, environment={**plan.environment, "agent_install": recipe.to_params()})

    # -- one attempt --------------------------------------------------------------
    async def start_session(
        self, task: TaskSpec, prepared: PreparedTask, env: EnvironmentSession, req: RunRequest, plan: ExecutionPlan
    ) -> _Session:
        deadline = _deadline(plan.timeouts.get("run"))
        install = getattr(env, "agent_install", None)
        if install is None:  # a provider that does not install agents: only an image that has it will do
            recipe = await self.recipe()
            found = await env.exec(["test", "-f", f"{recipe.prefix}/{MARKER}"], timeout=60, cwd="/")
            if not found.ok:
                raise SessionError(
                    f"{self.id} {recipe.version} is not installed in this environment, and provider "
                    f"{req.environment.id!r} does not install agent CLIs (the docker provider does)"
                )
        return _Session(deadline, install)

    async def run(
        self,
        session: Any,
        task: TaskSpec,
        prepared: PreparedTask,
        env: EnvironmentSession,
        req: RunRequest,
        plan: ExecutionPlan,
    ) -> RunResult:
        recipe = await self.recipe()
        if self.gateway is None:  # preflight refuses a request without a model; this is a programming slip
            raise RuntimeError(f"harness {self.id!r} was given no model gateway")
        await make_logs_dir(env)
        home = f"{LOGS_DIR}/{self.id}"
        async with self.gateway.open_attempt(env, task.task_id, plan.attempt_index) as grant:
            endpoint = ModelEndpoint(self.protocol, grant.base_url(self.protocol), grant.model, grant.token)
            ctx = AgentRun(prepared.prompt, endpoint, recipe.prefix, home, recipe.version, self.options)
            await _write_files(env, home, self.files(ctx))
            argv = [*self.command(ctx), *self.options.args]
            # The agent's helpers (rg, node) are found after the image's own tools, never before them.
            launch = ["sh", "-c", 'PATH="$PATH:$0"; export PATH; exec "$@"', f"{recipe.prefix}/bin", *argv]
            variables = {**self.environment(ctx), **self.options.env}
            outcome = await env.exec(launch, timeout=self._timeout(session), env=variables, cwd=prepared.workdir)
        report = await self._report(env, home, outcome.stdout)
        artifacts = {
            "stdout": save_artifact("agent/stdout.txt", outcome.stdout),
            "stderr": save_artifact("agent/stderr.txt", outcome.stderr),
            "logs": await collect_logs(
                env, Redactor(), self.options.max_log_files, self.options.max_log_bytes, home.lstrip("/")
            ),
        }
        metadata: dict[str, Any] = {
            "agent": {"id": self.id, "version": recipe.version, **exec_facts(outcome)},
            "agent_install": session.install if isinstance(session, _Session) else None,
            "agent_reported_usage": report.usage.to_dict() if report.usage else None,
            **report.extra,
        }
        kept = {k: v for k, v in artifacts.items() if v}
        if not outcome.ok:
            reason = "timed out" if outcome.timed_out else f"exited with {outcome.exit_code}"
            result = RunResult(
                task.task_id,
                output=outcome.stdout[-_TAIL:],
                status=RunStatus.INFERENCE_ERROR,
                error=f"{self.id} {reason} {self._why(report, outcome.stdout, outcome.stderr)}",
                artifacts=kept,
                metadata=metadata,
            )
        else:
            output = report.answer or outcome.stdout.strip()[-_TAIL:]
            result = RunResult(task.task_id, output=output, artifacts=kept, metadata=metadata)
        # The gateway's count of every call (metadata.usage) and its trajectory artifact.
        return grant.finish(result)

    def _why(self, report: AgentReport, stdout: str, stderr: str) -> str:
        """Why a failed run failed, and where that was read: the agent's report, else its error stream.

        Agents with a JSON-lines report put their error there, on stdout, and
        warnings on stderr; others print progress on stdout and the error on stderr.
        """
        if report.error and report.error.strip():
            return f"(its report): {report.error.strip()[-_TAIL:]}"
        streams = {"stdout": stdout.strip(), "stderr": stderr.strip()}
        other = "stdout" if self.error_stream == "stderr" else "stderr"
        where = self.error_stream if streams[self.error_stream] else other
        return f"({where}): {streams[where][-_TAIL:]}" if streams[where] else "(no output)"

    async def _report(self, env: EnvironmentSession, home: str, stdout: str) -> AgentReport:
        """The agent's own report (a cross-check of the gateway's count), never the task's fate."""
        text = stdout
        try:
            if self.report_file:
                text = (await env.read_bytes(f"{home}/{self.report_file}")).decode("utf-8", "replace")
            return self.parse_report(text)
        except Exception as exc:
            return AgentReport(extra={"agent_report_error": f"{type(exc).__name__}: {exc}"})

    def _timeout(self, session: Any) -> float | None:
        if self.options.timeout is not None:
            return float(self.options.timeout)
        deadline = session.deadline if isinstance(session, _Session) else None
        if deadline is None:
            return None
        return max(1.0, deadline - asyncio.get_running_loop().time())


async def _write_files(env: EnvironmentSession, home: str, files: dict[str, str]) -> None:
    """Make ``home`` and write ``files`` as the agent's user (an archive would leave root-owned
    folders the agent cannot write to)."""
    for path, text in {**{f"{home}/": ""}, **files}.items():
        written = await env.exec(
            ["sh", "-c", 'case "$F" in */) mkdir -p "$F";; *) mkdir -p "${F%/*}" && printf %s "$C" > "$F";; esac'],
            timeout=60,
            env={"F": path, "C": text},
            cwd="/",
        )
        if not written.ok:
            raise SessionError(f"cannot write {path} in the task environment: {written.stderr.strip()[-500:]}")
