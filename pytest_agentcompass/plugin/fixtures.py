"""pytest fixtures, the pytest way to supply things: components from fixtures, results to tests.

- ``id: "fixture:<name>"`` in a config names a **session-scoped** fixture as a
  component (benchmark, harness, environment provider, analyzer). Its value is
  a component instance (used as it is), or a class or factory called with the
  ``params`` like any other id. It is resolved through pytest's own fixture
  machinery once, when the request is collected, as seen from the config
  file's folder: ``conftest.py`` overrides apply per directory as usual, and
  the fixture is torn down at the end of the session.
- ``agentcompass_results``: after the tasks ran, ordinary tests that ask for it
  get each request's metrics, counts and outcomes (they are run after the tasks).

Concurrent attempts cannot each own a function-scoped fixture (pytest's
``SetupState`` is one stack), so resources of an attempt stay on its exit
stack; only session-scoped values are offered here. Resolving outside a test
function uses ``TopRequest`` the way ``_pytest/doctest.py`` does: private
API, kept working by the pinned pytest range and a pytester test.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ..vocabulary.errors import ComponentError
from .keys import run_key

if TYPE_CHECKING:
    from ..runtime.assembly import FixtureResolver
    from ..vocabulary.outcome import TaskOutcome

__all__ = ["RequestResults", "agentcompass_results", "fixture_resolver"]


class _FixtureLookup(pytest.Item):
    """Stands where the config file is, so fixture lookup sees the conftest files above it."""

    def runtest(self) -> None:  # never run: only used to resolve fixtures
        raise AssertionError("not a test")


def fixture_resolver(node: pytest.Collector) -> FixtureResolver:
    """A resolver of session-scoped fixture values as seen from ``node``."""

    def resolve(name: str, where: str) -> Any:
        from _pytest.fixtures import TopRequest

        session = node.session
        manager = session._fixturemanager
        lookup = _FixtureLookup.from_parent(node, name=f"fixture:{name}")
        definitions = manager.getfixturedefs(name, lookup)
        if not definitions:
            raise ComponentError(f"{where}: no fixture named {name!r} is visible from {node.path}")
        scope = definitions[-1].scope
        if scope != "session":
            raise ComponentError(
                f"{where}: fixture {name!r} is {scope}-scoped; a component fixture must be session-scoped "
                "(tasks run concurrently and outlive any narrower scope)"
            )
        lookup._fixtureinfo = manager.getfixtureinfo(node=lookup, func=None, cls=None)  # type: ignore[attr-defined]
        lookup.funcargs = {}  # type: ignore[attr-defined]
        setup_state = session._setupstate
        if session not in setup_state.stack:
            # Session-scoped finalizers attach to the session node, which must be set up.
            setup_state.setup(session)  # type: ignore[arg-type]
        try:
            return TopRequest(lookup, _ispytest=True).getfixturevalue(name)  # type: ignore[arg-type]
        except pytest.skip.Exception:
            raise
        except Exception as exc:
            raise ComponentError(f"{where}: fixture {name!r} raised {type(exc).__name__}: {exc}") from None

    return resolve


@dataclass
class RequestResults:
    """One request's results, as ``agentcompass_results`` gives them."""

    name: str
    run_dir: Path
    metrics: Mapping[str, Any]
    counts: Mapping[str, int]
    #: Task id -> terminal outcome (``result.score``, ``result.status``, ``passed``, ...).
    outcomes: Mapping[str, TaskOutcome] = field(default_factory=dict)


@pytest.fixture(scope="session")
def agentcompass_results(request: pytest.FixtureRequest) -> Mapping[str, RequestResults]:
    """Metrics, counts and outcomes of every request that ran, by request name.

    Tests that use it run after the tasks. Under ``-n`` results are only known
    to the controller at the end, so such a test is an error on a worker, not
    a skip: a quality bar that silently passes in CI would be worse.
    """
    run = request.config.stash.get(run_key, None)
    if run is None:
        pytest.skip("agentcompass_results needs --agentcompass")
    if run.is_worker:
        pytest.fail(
            "agentcompass_results is not available under xdist (-n): a worker holds only its own tasks' results. "
            "Put the bar in the config's gates: (checked by the controller), or run this test without -n",
            pytrace=False,
        )
    return {
        state.name: RequestResults(
            name=state.name,
            run_dir=state.store.run_dir,
            metrics=dict(state.metrics or {}),
            counts=state.counts(),
            outcomes=dict(state.outcomes),
        )
        for state in run.runtimes
    }
