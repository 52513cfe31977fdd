"""The HTML report in real headless chromium: every task, the metrics and the chart in the DOM; filters work.

Skipped without a browser locally; in CI (``CI=true``) a missing browser fails.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest

from browser import browser, dump_dom, file_url, require_chromium
from conftest import tracing_request, write_config, write_run

TASK_ROW = re.compile(
    r'<tr class="task" data-i="\d+"><td>[^<]*</td><td>([^<]*)</td><td[^>]*>[^<]*</td><td class="(\w+)"'
)


@pytest.fixture(scope="module")
def chromium() -> str:
    return require_chromium()


@pytest.fixture
def session_page(pytester: pytest.Pytester, trace: Path) -> Path:
    write_config(
        pytester,
        [
            tracing_request("a", trace, n=6, wrong=["t1", "t4"], fail={"run": {"t2": -1}}),
            tracing_request("b", trace, n=3, categories=["easy", "hard", "hard"]),
        ],
    )
    pytester.runpytest("--agentcompass=agentcompass.yaml", "--agentcompass-html=report.html")
    return pytester.path / "report.html"


@pytest.mark.parametrize(("ci", "outcome"), [("true", pytest.fail.Exception), ("", pytest.skip.Exception)])
def test_a_missing_browser_fails_in_ci_and_skips_locally(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, ci: str, outcome: type[BaseException]
) -> None:
    monkeypatch.setenv("AGENTCOMPASS_CHROMIUM", str(tmp_path / "no-such-browser"))
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match="chromium is not installed"):
        require_chromium()


def test_the_browser_leaves_nothing_in_the_temporary_folder(chromium: str) -> None:
    """A terminated chromium left its singleton-socket folder in /tmp, one per session (now in its profile)."""
    tmp = Path(tempfile.gettempdir())

    def ours() -> set[Path]:
        # Not the profiles: another xdist worker's browser test may hold one right now.
        return set(tmp.glob("org.chromium.Chromium.*"))

    before = ours()
    with browser(chromium) as page:
        page.open("about:blank")
        assert page.evaluate("1 + 1") == 2
    dump_dom(chromium, "about:blank")
    assert ours() - before == set()


def rows(dom: str) -> list[tuple[str, str]]:
    return TASK_ROW.findall(dom)


def test_dom_has_every_task_the_metrics_and_the_chart(chromium: str, session_page: Path) -> None:
    dom = dump_dom(chromium, file_url(session_page))
    request_a = [("t0", "passed"), ("t1", "failed"), ("t2", "error"), ("t3", "passed"), ("t4", "failed")]
    request_b = [("t0", "passed"), ("t1", "passed"), ("t2", "passed")]
    assert sorted(rows(dom)) == sorted([*request_a, ("t5", "passed"), *request_b])
    assert 'data-rendered="9"' in dom and "9 of 9 tasks" in dom
    for metric in ("mean_score", "pass@1", "<td>0.5</td>"):
        assert metric in dom
    assert dom.count('<svg class="chart"') == 2
    assert dom.count("<rect ") == 22, "ten score bins and an error bar per request"


@pytest.mark.parametrize(
    ("fragment", "expected"),
    [
        ("state=failed", [("t1", "failed"), ("t4", "failed")]),
        ("state=error", [("t2", "error")]),
        ("q=hard", [("t1", "passed"), ("t2", "passed")]),
        ("request=1&state=passed", [("t0", "passed"), ("t1", "passed"), ("t2", "passed")]),
    ],
)
def test_filters_from_the_address(
    chromium: str, session_page: Path, fragment: str, expected: list[tuple[str, str]]
) -> None:
    dom = dump_dom(chromium, file_url(session_page, fragment))
    assert sorted(rows(dom)) == sorted(expected)


def test_typing_a_filter_sorting_and_opening_a_task(chromium: str, session_page: Path) -> None:
    with browser(chromium) as page:
        page.open(file_url(session_page))
        ids = "Array.from(document.querySelectorAll('tr.task')).map(r => r.children[1].textContent)"
        assert len(page.evaluate(ids)) == 9
        page.evaluate("var q = document.getElementById('f-q'); q.value = 't4'; q.dispatchEvent(new Event('input'))")
        assert page.evaluate(ids) == ["t4"]
        page.evaluate("q.value = ''; q.dispatchEvent(new Event('input'))")
        page.evaluate(
            "var s = document.getElementById('f-state'); s.value = 'error'; s.dispatchEvent(new Event('input'))"
        )
        assert page.evaluate(ids) == ["t2"]
        # Open the errored task: its error and trace are shown.
        page.evaluate("document.querySelector('tr.task').click()")
        detail = page.evaluate("document.querySelector('tr.detail').textContent")
        assert "injected run failure" in detail and "Trace" in detail
        page.evaluate("s.value = ''; s.dispatchEvent(new Event('input'))")
        page.evaluate("document.querySelector('th[data-col=\"score\"]').click()")
        scores = page.evaluate("Array.from(document.querySelectorAll('tr.task')).map(r => r.children[4].textContent)")
        assert scores == ["1"] * 6 + ["0"] * 2 + [""], "descending, the errored task (no score) last"
        assert page.evaluate("location.hash") == "#sort=score&dir=-1"


def test_ten_thousand_task_pages_render_lazily_and_every_task_is_reachable(chromium: str, tmp_path: Path) -> None:
    run_dir = tmp_path / "runs/r/big"
    write_run(run_dir, {f"task-{i:04d}": {"state": "failed" if i % 3 == 0 else "passed"} for i in range(3000)})
    from pytest_agentcompass.reports.cli import main

    assert main(["report", str(run_dir)]) == 0
    with browser(chromium) as page:
        page.open(file_url(run_dir / "report.html"))
        count = "document.querySelectorAll('tr.task').length"
        assert page.evaluate(count) == 500, "one page of rows at first"
        assert page.evaluate("document.getElementById('more').textContent") == "showing 500 of 3000: scroll for more"
        page.evaluate(
            "new Promise(function (done) { window.scrollTo(0, document.body.scrollHeight);"
            " (function wait() { if (document.querySelectorAll('tr.task').length > 500) done();"
            " else setTimeout(wait, 10); })(); })"
        )
        assert page.evaluate(count) >= 1000
        page.evaluate(
            "var q = document.getElementById('f-q'); q.value = 'task-2999'; q.dispatchEvent(new Event('input'))"
        )
        assert page.evaluate("document.querySelector('tr.task').children[1].textContent") == "task-2999"
        page.evaluate(
            "q.value = ''; var s = document.getElementById('f-state'); s.value = 'failed';"
            " s.dispatchEvent(new Event('input'))"
        )
        assert page.evaluate("document.getElementById('shown').textContent") == "1000 of 3000 tasks"
        assert page.evaluate(count) == 1000, "up to 2000 matching rows are rendered at once"
