"""Hooks of pytest-agentcompass, for plugins and ``conftest.py`` files.

Registered through ``pytest_addhooks`` whenever the plugin is installed (declaring
hooks has no side effects); they are only called when ``--agentcompass`` is given.
Each hook says where it is called.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from ..config import RunRequest
    from ..runtime.registry import Registry
    from ..vocabulary.outcome import TaskOutcome
    from ..vocabulary.protocols import Recipe


def pytest_agentcompass_register(registry: Registry) -> None:
    """Register component ids before any request is built.

    Called once per process, at the first collection of a config file (or
    before ``--markers`` lists task categories).

    Call ``registry.register(kind, name, obj)`` with ``kind`` one of
    ``benchmark``, ``harness``, ``environment``, ``strategy``, ``analyzer``,
    ``recipe``.

    :param registry: The session's component registry.
    """


def pytest_agentcompass_recipes(req: RunRequest) -> Sequence[Recipe] | None:
    """Return plan recipes to apply to the attempts of ``req``.

    Called once per request when it is collected, through the config file
    node's ``ihook`` (so only the ``conftest.py`` files above it apply).

    Results of all implementations are concatenated; recipes listed in the
    config run first. Each recipe declares the plan fields it may change.

    :param req: The request whose plans will be adjusted.
    """


@pytest.hookspec(firstresult=True)
def pytest_agentcompass_make_run_id(config: pytest.Config) -> str | None:
    """Return the run id of this session: the folder name of a new run directory.

    Called once, in ``pytest_configure`` (on the xdist controller; workers
    receive the controller's id). Stops at the first non-None result. The
    default is the UTC time to the microsecond plus a random suffix, so ids
    sort by creation time.

    :param config: The pytest config.
    """


@pytest.hookspec(
    firstresult=True,
    warn_on_impl=DeprecationWarning(
        "pytest_agentcompass_make_session_id is deprecated: implement pytest_agentcompass_make_run_id"
    ),
)
def pytest_agentcompass_make_session_id(config: pytest.Config) -> str | None:
    """Deprecated alias of :func:`pytest_agentcompass_make_run_id`, still honoured (asked first)."""


def pytest_agentcompass_task_finished(item: pytest.Item, outcome: TaskOutcome) -> None:
    """Called once per selected task when it is terminal, before its reports are sent.

    Called for every way a task ends: run in process, run on an xdist worker
    (then in that worker), resumed from an interrupted run, or carried over from an
    earlier one (``outcome.carried_over``). In process it runs in the event-loop
    thread: keep it quick.

    :param item: The task's pytest item.
    :param outcome: The terminal outcome (result, retries, detail path).
    """


def pytest_agentcompass_request_finalized(request: str, summary: Mapping[str, Any]) -> None:
    """Called once per request after its ``summary.json`` is written.

    Called in the process that finalizes: the pytest process, or the xdist
    controller under ``-n``.

    :param request: The request name.
    :param summary: The summary as written: ``run_id``, ``status``,
        ``metrics``, ``counts`` and ``tasks`` (one line per task: ``task_id``,
        ``status``, ``score``, ``passed``, ``carried_over``).
    """
