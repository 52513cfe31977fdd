"""Exceptions a user can cause, each with a message that names what and where.

The pytest face prints ``str(exc)`` of these without a traceback: the message
must stand on its own.
"""

from __future__ import annotations

__all__ = [
    "AgentCompassError",
    "ArtifactError",
    "ComponentError",
    "ConfigError",
    "EnvironmentLost",
    "SessionError",
    "PolicyError",
    "PreflightError",
    "TaskIdError",
    "TaskSetupError",
    "UserBaseException",
    "UserExit",
    "WorkspacePathError",
]


class AgentCompassError(Exception):
    """Base class of every error this plugin raises on purpose."""


class ConfigError(AgentCompassError):
    """The YAML config is unreadable or does not validate."""


class ComponentError(AgentCompassError):
    """A benchmark, harness, environment, strategy or analyzer id does not resolve."""


class TaskIdError(AgentCompassError):
    """A task id is empty, duplicated or unsafe as a file name or node id."""


class PolicyError(AgentCompassError):
    """A plan asks for a network policy transition the provider cannot honour."""


class PreflightError(AgentCompassError):
    """A dependency or component is unusable; raised before any task runs."""


class SessionError(AgentCompassError):
    """An Environment could not be opened or used."""


class EnvironmentLost(SessionError):
    """The Environment itself is gone for a reason outside it (its Docker engine stopped answering).

    A provider raises this only for what the agent in the Environment cannot
    cause; the retry policy then treats it as an infrastructure fault
    (``environment``), wherever it surfaces. Any other :class:`SessionError`
    raised inside a benchmark's or harness's code is that code's failure: a
    file the agent broke raises one too.
    """


class TaskSetupError(SessionError):
    """The task's own files or requests leave no Environment to open: a Dockerfile that does
    not parse or whose step fails, no environment folder, GPUs the provider cannot give.

    Deterministic, so never retried, and the task's fault, not the infrastructure's: the
    task ends as a ``task_error`` (a failed setup, like a malformed ``task.toml``).
    """


class WorkspacePathError(SessionError):
    """A path given to an Environment escapes its workspace."""


class ArtifactError(AgentCompassError):
    """A submission artifact is too large, of the wrong type or empty."""


class UserExit(AgentCompassError):
    """A lifecycle method called ``sys.exit()`` or raised ``KeyboardInterrupt``.

    Out of a task, either would end the event loop, and with it every other
    task and the run's bookkeeping. As in a pytest test, ``sys.exit()`` fails
    that task alone, and ``KeyboardInterrupt`` interrupts the run as Ctrl-C
    does (the plugin raises SIGINT for it).
    """


class UserBaseException(AgentCompassError):
    """A lifecycle method raised a ``BaseException`` that is not an ``Exception``.

    A ``CancelledError`` its task was not cancelled with, ``GeneratorExit``,
    or a class of the benchmark's own. Let through, asyncio takes the first
    for a cancellation (the task ended unrecorded, the run passed) and the
    others end the event loop (INTERNALERROR, results lost): each fails its
    task instead, as an error does.
    """
