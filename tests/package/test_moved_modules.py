"""Module paths of earlier releases keep working until ``MOVED_UNTIL``, warning once with the new path."""

from __future__ import annotations

import ast
import importlib
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

import pytest_agentcompass
from pytest_agentcompass import MOVED_MODULES, MOVED_UNTIL

PACKAGE = "pytest_agentcompass"
REPOSITORY = Path(pytest_agentcompass.__file__).parent.parent


@pytest.fixture(autouse=True)
def forget_old_paths() -> Iterator[None]:
    """Each test imports the old paths as a first import would (the new modules stay loaded)."""

    def forget() -> None:
        for name in [n for n in sys.modules if pytest_agentcompass.moved_to(n) is not None]:
            del sys.modules[name]
        for old in MOVED_MODULES:
            if "." not in old:
                pytest_agentcompass.__dict__.pop(old, None)

    forget()
    yield
    forget()


@pytest.mark.parametrize(("old", "new"), sorted(MOVED_MODULES.items()))
def test_an_old_module_path_is_the_new_module_and_warns_once(old: str, new: str) -> None:
    current = importlib.import_module(f"{PACKAGE}.{new}")
    with pytest.warns(DeprecationWarning) as caught:
        aliased = importlib.import_module(f"{PACKAGE}.{old}")
    assert aliased is current
    ours = [w for w in caught if f"{PACKAGE}.{old} moved" in str(w.message)]
    assert [str(w.message) for w in ours] == [
        f"{PACKAGE}.{old} moved to {PACKAGE}.{new}; the old path stops working in {MOVED_UNTIL}"
    ]
    assert ours[0].filename == __file__, "the warning points at the line that imported the old path"
    assert current.__spec__ is not None and current.__spec__.name == f"{PACKAGE}.{new}"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert importlib.import_module(f"{PACKAGE}.{old}") is current  # once: no second warning
        for name in getattr(current, "__all__", ()):
            assert getattr(aliased, name) is getattr(current, name)


def test_from_imports_attribute_access_and_modules_under_an_old_package_path() -> None:
    with pytest.warns(DeprecationWarning, match=r"pytest_agentcompass\.types moved to .*vocabulary\.types"):
        from pytest_agentcompass.types import TaskSpec
    assert TaskSpec is pytest_agentcompass.TaskSpec
    with pytest.warns(DeprecationWarning, match=r"pytest_agentcompass\.testing moved to .*environments\.conformance"):
        kit = pytest_agentcompass.testing
    assert kit is importlib.import_module(f"{PACKAGE}.environments.conformance")
    with pytest.warns(DeprecationWarning) as caught:
        import pytest_agentcompass.agents_cache.npm as npm
    assert [str(w.message).split(";")[0] for w in caught] == [
        f"{PACKAGE}.agents_cache moved to {PACKAGE}.harnesses.agents.cache",
        f"{PACKAGE}.agents_cache.npm moved to {PACKAGE}.harnesses.agents.cache.npm",
    ]
    # Loaded once, under its new name: not a second copy found in the new folder under the old name.
    assert npm is sys.modules[f"{PACKAGE}.harnesses.agents.cache.npm"]
    assert npm.NpmPackage is pytest_agentcompass.NpmPackage
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing moved there: no warning, the usual error
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(f"{PACKAGE}.agents_cache.nosuch")


def test_a_monkeypatch_through_the_old_path_changes_the_module(monkeypatch: pytest.MonkeyPatch) -> None:
    def one_slot() -> int:
        return 1

    with pytest.warns(DeprecationWarning):
        monkeypatch.setattr(f"{PACKAGE}.limits.task_slots", one_slot)
    assert importlib.import_module(f"{PACKAGE}.concurrency.limits").task_slots is one_slot


def test_nothing_of_ours_imports_an_old_path() -> None:
    """The package, its tests, the perf scripts and the examples use the new paths (old ones warn)."""
    found = []
    for folder in ("pytest_agentcompass", "tests", "perf", "example_suites"):
        for path in sorted((REPOSITORY / folder).rglob("*.py")):
            if path == Path(__file__):
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = []
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
                found += [f"{path}:{node.lineno}: {n}" for n in names if pytest_agentcompass.moved_to(n)]
    assert found == []
