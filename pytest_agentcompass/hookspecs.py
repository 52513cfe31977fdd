"""Hooks of pytest-agentcompass, for plugins and ``conftest.py`` files.

Registered through ``pytest_addhooks`` whenever the plugin is installed (declaring
hooks has no side effects); they are only called when ``--agentcompass`` is given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from .config import RunRequest
    from .registry import Registry
    from .runtime.planner import Recipe
    from .runtime.task import TaskOutcome


def pytest_agentcompass_register(registry: Registry) -> None:
    """Register component ids before any request is built.

    Call ``registry.register(kind, name, obj)`` with ``kind`` one of
    ``benchmark``, ``harness``, ``environment``, ``strategy``, ``analyzer``,
    ``recipe``.

    :param registry: The session's component registry.
    """


def pytest_agentcompass_recipes(req: RunRequest) -> Sequence[Recipe] | None:
    """Return plan recipes to apply to the attempts of ``req``.

    Results of all implementations are concatenated; recipes listed in the
    config run first. Each recipe declares the plan fields it may change.

    :param req: The request whose plans will be adjusted.
    """


@pytest.hookspec(firstresult=True)
def pytest_agentcompass_make_session_id(config: pytest.Config) -> str | None:
    """Return the run id used for every request of this session.

    Stops at the first non-None result. The default is a timestamp plus a
    random suffix.

    :param config: The pytest config.
    """


def pytest_agentcompass_task_finished(item: pytest.Item, outcome: TaskOutcome) -> None:
    """Called when a task is terminal, before its reports are sent.

    Runs in the event-loop thread: keep it quick.

    :param item: The task's pytest item.
    :param outcome: The terminal outcome (result, retries, detail path).
    """


def pytest_agentcompass_request_finalized(request: str, summary: Mapping[str, Any]) -> None:
    """Called after a request's ``summary.json`` is written.

    :param request: The request name.
    :param summary: The summary as written (metrics, counts, per-task lines).
    """
