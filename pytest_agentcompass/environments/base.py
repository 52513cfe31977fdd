"""The Environment provider contract.

A provider (:class:`BaseEnvironment`) is built once per request from its
:class:`~pytest_agentcompass.config.EnvironmentSpec`; each attempt asks it to
``open`` an :class:`EnvironmentSession`, and closes that session itself.
"""

from __future__ import annotations

import abc
import contextvars
import functools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from ..concurrency.limits import rate_limiter_for
from ..vocabulary.errors import PolicyError
from ..vocabulary.types import ExecResult, ExecutionPlan, NetworkPolicy

if TYPE_CHECKING:
    from ..config import EnvironmentSpec
    from ..vocabulary.artifacts import RunFiles

__all__ = ["BaseEnvironment", "EnvironmentSession", "HostRoute", "SessionConfig", "SessionPurpose", "argv_list"]

SessionPurpose = Literal["task", "evaluation"]

# Set while a throttled ``open`` runs, so a subclass calling ``super().open``
# is not throttled twice.
_throttled: contextvars.ContextVar[bool] = contextvars.ContextVar("agentcompass_throttled", default=False)


def argv_list(argv: Sequence[str]) -> list[str]:
    """``argv`` as a list; a string is refused, since splitting it would guess at the shell's quoting.

    :raises TypeError: for a ``str`` (a common slip that would otherwise run each character).
    """
    if isinstance(argv, str):
        raise TypeError("exec takes an argument list, not a string; use ['sh', '-c', cmd]")
    return list(argv)


@dataclass(frozen=True)
class SessionConfig:
    """What a provider needs to open one session, derived from the plan.

    :param network_policy: The policy the session starts with (the plan's baseline).
    :param labels: Identifying labels (run id, request, task) a provider may
        attach to what it creates, so leaks can be traced and swept.
    """

    purpose: SessionPurpose
    task_id: str
    attempt_index: int
    network_policy: NetworkPolicy
    params: Mapping[str, Any] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    #: Where to open it when the provider has a choice: a ``fresh`` evaluation asks for its task's.
    placement: str | None = None
    #: The session stays open after the run (``keep_environment``): it must not depend on anything
    #: the provider removes at its :meth:`~BaseEnvironment.aclose`.
    kept: bool = False


@dataclass(frozen=True)
class HostRoute:
    """How processes in a session reach a server of this process (the model gateway) during the run phase.

    :param listen: The address the server listens on, here.
    :param host: The address the session reaches it at (the same, unless something translates).
    :param admit: Called with the server's port once it listens: narrows what the
        session can reach to that port, where the provider can (a firewall).
    :param release: Undoes the route (detaches the session), when the attempt's grant closes.
    """

    listen: str
    host: str
    admit: Callable[[int], Awaitable[None]] | None = None
    release: Callable[[], Awaitable[None]] | None = None


class EnvironmentSession(abc.ABC):
    """One open sandbox. Every method is a coroutine and may be cancelled."""

    network_policy: NetworkPolicy = "full"
    #: Where the session runs when the provider had a choice (a Docker engine of a pool), for the task detail.
    placement: str | None = None

    @abc.abstractmethod
    async def exec(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> ExecResult:
        """Run ``argv`` and wait for it; on timeout the whole process tree is killed."""

    @abc.abstractmethod
    async def read_bytes(self, path: str) -> bytes:
        """Read a file of the session."""

    @abc.abstractmethod
    async def write_bytes(self, path: str, data: bytes) -> None:
        """Write a file of the session, creating parent directories."""

    async def read_head(self, path: str, limit: int) -> tuple[bytes, int]:
        """The first ``limit`` bytes of a file and its whole size. Providers that can read part
        of a file override this, so a huge (or sparse) file costs ``limit`` bytes, not its size."""
        data = await self.read_bytes(path)
        return data[:limit], len(data)

    async def read_text(self, path: str, encoding: str = "utf-8") -> str:
        return (await self.read_bytes(path)).decode(encoding)

    async def write_text(self, path: str, text: str, encoding: str = "utf-8") -> None:
        await self.write_bytes(path, text.encode(encoding))

    async def set_network_policy(self, policy: NetworkPolicy) -> None:
        """Switch the session's network access; providers that can override this."""
        if policy != self.network_policy:
            raise PolicyError(
                f"{type(self).__name__} cannot switch network policy from {self.network_policy!r} to {policy!r}"
            )

    @abc.abstractmethod
    async def close(self) -> None:
        """Release everything the session holds. Must be idempotent and safe
        to call on a session whose ``open`` failed halfway."""

    def describe(self) -> str:
        """A human pointer to the session (path, container id), for kept environments."""
        return repr(self)

    async def detach(self) -> None:
        """The attempt is done with a session it keeps (``keep_environment``): give back what
        counts it (a provider's slot) without closing it."""


class BaseEnvironment(abc.ABC):
    """An Environment provider.

    Subclasses set :attr:`id`, the policies they support, and implement
    :meth:`open`. The open-rate limit is applied around every subclass's
    ``open`` automatically.
    """

    id: ClassVar[str] = ""
    #: Policies a session can be opened with or switched to.
    supported_network_policies: ClassVar[frozenset[str]] = frozenset({"full"})
    #: Whether a live session can change policy; if not, every phase must use the baseline.
    dynamic_network_policy: ClassVar[bool] = False

    #: The provider's params model (a :class:`~pytest_agentcompass.config.ParamsModel`), if it declares one.
    params_model: ClassVar[type[Any] | None] = None

    #: The request's run directory, set before the first attempt: to read. Nothing
    #: writes there but the store: save files with
    #: :func:`~pytest_agentcompass.save_artifact` (an attempt's) or :attr:`run_files` (the request's).
    run_dir: Path | None = None
    #: The request's own files in its run directory (``RunFiles``), set with :attr:`run_dir`.
    run_files: RunFiles | None = None

    def __init__(self, spec: EnvironmentSpec, rootdir: Path | None = None) -> None:
        self.spec = spec
        #: Relative paths in ``spec.params`` are relative to this (the config file's folder).
        self.rootdir = rootdir or Path.cwd()
        #: ``spec.params`` validated by :attr:`params_model` (set by assembly; ``None`` without a model).
        self.params: Any = None
        #: What the user should know after preflight (e.g. an engine left out), shown in the request's summary.
        self.notes: list[str] = []

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        original = cls.__dict__.get("open")
        if original is None or getattr(original, "__agentcompass_throttled__", False):
            return

        @functools.wraps(original)
        async def open(self: BaseEnvironment, config: SessionConfig) -> EnvironmentSession:
            if not self.spec.open_qps or _throttled.get():  # unlimited: no lookup, no lock
                return await original(self, config)  # type: ignore[no-any-return]
            await rate_limiter_for(self.spec.id, self.spec.open_qps).wait()
            token = _throttled.set(True)
            try:
                return await original(self, config)  # type: ignore[no-any-return]
            finally:
                _throttled.reset(token)

        open.__agentcompass_throttled__ = True  # type: ignore[attr-defined]
        cls.open = open  # type: ignore[method-assign]

    def validate_plan(self, plan: ExecutionPlan) -> None:
        """Reject a plan whose network policies this provider cannot honour.

        :raises PolicyError: naming the phase and the policy.
        """
        phases: list[tuple[str, str]] = [
            ("baseline", plan.baseline_network_policy),
            ("run", plan.run_network_policy),
        ]
        if plan.evaluation_environment_mode != "none":
            phases.append(("evaluation", plan.evaluation_network_policy))
        for phase, policy in phases:
            if policy not in self.supported_network_policies:
                raise PolicyError(
                    f"environment {self.spec.id!r} does not support network policy {policy!r} "
                    f"(asked for the {phase} phase); supported: "
                    f"{', '.join(sorted(self.supported_network_policies))}"
                )
            if policy != plan.baseline_network_policy and not self.dynamic_network_policy:
                raise PolicyError(
                    f"environment {self.spec.id!r} cannot switch network policy at run time, "
                    f"but the plan asks for {policy!r} in the {phase} phase and "
                    f"{plan.baseline_network_policy!r} at baseline"
                )

    def build_config(
        self, plan: ExecutionPlan, purpose: SessionPurpose, labels: Mapping[str, str] | None = None
    ) -> SessionConfig:
        """Validate ``plan`` and derive the config for one session.

        ``params`` are the provider's, with the plan's per-task ``environment``
        params filling every key the config did not set itself.
        """
        self.validate_plan(plan)
        params = dict(self.spec.params)
        if plan.environment:
            fields_set = getattr(self.params, "model_fields_set", None)
            given = set(self.spec.params) if fields_set is None else set(fields_set)
            params.update((k, v) for k, v in plan.environment.items() if k not in given)
        return SessionConfig(
            purpose=purpose,
            task_id=plan.task_id,
            attempt_index=plan.attempt_index,
            network_policy=plan.baseline_network_policy,
            params=params,
            labels=dict(labels or {}),
        )

    async def preflight(self) -> None:
        """Check the provider is usable (engine reachable, packages present).

        Runs once before any task; raise :class:`~pytest_agentcompass.vocabulary.errors.PreflightError`.
        """

    @abc.abstractmethod
    async def open(self, config: SessionConfig) -> EnvironmentSession:
        """Open a session. If it fails halfway, release what was acquired before raising."""

    async def host_route(self, session: EnvironmentSession) -> HostRoute:
        """A route from ``session`` to a server of this process, for the run phase (the model gateway).

        Providers whose sessions can reach this process override it (``local``:
        loopback; ``docker``: an internal network). The default refuses.

        :raises PolicyError: when the provider offers no such route.
        """
        raise PolicyError(
            f"environment {self.spec.id!r} gives its sessions no route to the runner's model gateway "
            "(which this harness needs); use the 'local' or 'docker' environment"
        )

    @classmethod
    def routes_to_host(cls) -> bool:
        """Whether :meth:`host_route` is implemented (checked at preflight)."""
        return cls.host_route is not BaseEnvironment.host_route

    async def end_attempt(self, task_id: str, attempt_index: int) -> None:
        """Attempt ``attempt_index`` of ``task_id`` is over and its sessions are closed: release what
        the provider kept for it across sessions (the snapshot its evaluation session started from).
        Called once per attempt, also after a failure or a cancel."""

    async def sweep(self, run_id: str) -> int:
        """Remove what sessions of run ``run_id`` left behind when their process died.

        Called before an interrupted run is resumed; returns how many were removed.
        """
        return 0

    async def sweep_own(self, run_id: str) -> int:
        """Remove what this process's sessions of run ``run_id`` left open: the end of a run whose
        cleanups did not finish within the grace. Other processes of the run (xdist's workers) may
        still be running theirs, so a provider that can tell them apart
        (:func:`~.markers.this_process`) overrides this; by default it is :meth:`sweep`."""
        return await self.sweep(run_id)

    async def aclose(self) -> None:
        """Release request-level resources (clients, pools). Idempotent."""
