"""The HTML report's integrity column and filter in real headless chromium (skipped without one locally)."""

from __future__ import annotations

from pathlib import Path

import pytest

from browser import browser, dump_dom, file_url, require_chromium
from conftest import write_run

FINDING = {"check": "tool-replaced", "path": "/usr/bin/python3", "message": "changed after the agent ran"}


@pytest.fixture(scope="module")
def chromium() -> str:
    return require_chromium()


@pytest.fixture
def page(tmp_path: Path) -> Path:
    run_dir = tmp_path / "runs/r/one"
    write_run(
        run_dir,
        {
            "clean": {},
            "flagged": {"metadata": {"integrity": [FINDING, {**FINDING, "path": "/usr/bin/bash"}]}},
            "failed-flagged": {"state": "failed", "metadata": {"integrity": [FINDING]}},
        },
    )
    from pytest_agentcompass.reports.cli import main

    assert main(["report", str(run_dir)]) == 0
    return run_dir / "report.html"


@pytest.mark.parametrize(
    ("fragment", "expected"),
    [("integrity=flagged", ["failed-flagged", "flagged"]), ("integrity=clean", ["clean"]), ("", None)],
)
def test_the_integrity_filter(chromium: str, page: Path, fragment: str, expected: list[str] | None) -> None:
    with browser(chromium) as tab:
        tab.open(file_url(page, fragment) if fragment else file_url(page))
        ids = tab.evaluate("Array.from(document.querySelectorAll('tr.task')).map(r => r.children[1].textContent)")
        assert sorted(ids) == (expected or ["clean", "failed-flagged", "flagged"])


def test_a_flagged_task_shows_its_findings(chromium: str, page: Path) -> None:
    with browser(chromium) as tab:
        tab.open(file_url(page, "integrity=flagged&q=failed"))
        cells = tab.evaluate("Array.from(document.querySelector('tr.task').children).map(c => c.className)")
        assert cells[-1] == "flagged"
        tab.evaluate("document.querySelector('tr.task').click()")
        detail = tab.evaluate("document.querySelector('tr.detail').textContent")
        assert "Integrity findings" in detail
        assert "tool-replaced /usr/bin/python3: changed after the agent ran" in detail
    assert "integrity" in dump_dom(chromium, file_url(page))
