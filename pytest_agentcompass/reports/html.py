"""One self-contained HTML page per run directory or session: metrics, counts, a chart, the task table.

Everything is what the store wrote (``summary.json``, ``run_info.json``,
``details/``, ``retry_details/``): at the end of a run, the details as the
store kept them in memory when it wrote them (``page_records``); from
``python -m pytest_agentcompass report``, read from the files. The page
inlines its CSS and JS (``assets/``) and the data as one JSON block; each
request's block, its score chart an SVG, comes from ``html_blocks``. Per-task texts are clipped, more tightly the
more tasks there are, and once the page's data reaches :data:`PAGE_BUDGET`
the remaining tasks keep their table row but point to their detail file for
the rest, so ten thousand tasks stay well under 10 MB.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from ..runtime.store.details import DetailFiles
from ..runtime.store.files import read_run_info_head
from ..runtime.store.page_records import Cut, PageRecords
from .baseline import Baseline, compare, read_run_tasks, state_of
from .html_blocks import clip as _clip
from .html_blocks import esc, findings_of, request_block

__all__ = ["PAGE_BUDGET", "render_page", "write_run_report", "write_session_report"]

#: Characters of per-task detail text a page holds before it only links to detail files.
PAGE_BUDGET = 6_000_000
#: A trajectory file larger than this is linked, not inlined.
TRAJECTORY_MAX_BYTES = 2_000_000
REPORT_FILE = "report.html"


def write_run_report(store: Any, baseline: Baseline | None = None) -> Path:
    """``report.html`` in the run directory of ``store`` (a ``RunStore``), written through it.

    Built from what the store kept of each detail as it wrote or read it
    (``RunStore.page_records``), never by reading the details back.
    """
    run_dir: Path = store.run_dir
    details = store.page_records()
    known = {run_dir: details} if details is not None else None
    title = f"{run_dir.parent.name} / {run_dir.name}"
    # Written in pieces: the page of 10,000 tasks is megabytes, and each whole copy of it (joined,
    # escaped, encoded) raised the run's peak memory at its very end (issue 27).
    chunks = page_chunks([run_dir], baseline, link_base=run_dir, title=title, known=known)
    path: Path = store.write_page(REPORT_FILE, chunks)
    return path


def write_session_report(path: Path, run_dirs: Sequence[Path], baseline: Baseline | None = None) -> Path:
    """The page of a whole session (``--agentcompass-html``), written atomically to ``path``."""
    page = render_page(run_dirs, baseline, link_base=path.parent, title="agentcompass session")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(page, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
    return path


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath("assets", name).read_text(encoding="utf-8")


def render_page(
    run_dirs: Sequence[Path],
    baseline: Baseline | None,
    *,
    link_base: Path,
    title: str,
    known: Mapping[Path, Sequence[Mapping[str, Any]]] | None = None,
) -> str:
    """The page for ``run_dirs`` (one or more requests); links are relative to ``link_base``.

    ``known``: detail records already in memory, by run directory; the others are read from disk.
    """
    return "".join(page_chunks(run_dirs, baseline, link_base=link_base, title=title, known=known))


#: Task details per piece of the page :func:`page_chunks` yields.
_DETAILS_PER_CHUNK = 500


def _script_safe(text: str) -> str:
    """``text`` inside the page's JSON script element: "</" must not end it early, "<!--" must not open a comment."""
    return text.replace("<", "\\u003c")


def page_chunks(
    run_dirs: Sequence[Path],
    baseline: Baseline | None,
    *,
    link_base: Path,
    title: str,
    known: Mapping[Path, Sequence[Mapping[str, Any]]] | None = None,
) -> Iterator[str]:
    """:func:`render_page`'s text in pieces, in order, none of them the whole page."""
    known = known or {}
    page = _Page(link_base, baseline, sum(len(known[d]) if d in known else _count_details(d) for d in run_dirs))
    blocks = [page.add_run(Path(d), index, known.get(d)) for index, d in enumerate(run_dirs)]
    columns = ["request", "task", "category", "state", "score", "attempts", "retries", "duration", "tokens", "error"]
    if baseline is not None:
        columns.append("change")
    if any(page.integrity):  # integrity findings: a column and a filter, when a task has any
        columns.append("integrity")
        for row, count in zip(page.rows, page.integrity, strict=True):
            row.append(count or None)
    requests = "\n".join(blocks)
    options = "".join(f'<option value="{i}">{esc(r["name"])}</option>' for i, r in enumerate(page.requests))
    change_filter = (
        '<select id="f-change" aria-label="change"><option value="">any change</option>'
        + "".join(f"<option>{c}</option>" for c in ("regression", "improvement", "still failing", "new", "unchanged"))
        + "</select>"
        if baseline is not None
        else ""
    )
    integrity_filter = (
        '<select id="f-integrity" aria-label="integrity"><option value="">any integrity</option>'
        "<option>flagged</option><option>clean</option></select>"
        if "integrity" in columns
        else ""
    )
    heads = "".join(f'<th data-col="{c}">{c}</th>' for c in columns)
    generated = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    source = f" · baseline: {esc(baseline.source)}" if baseline is not None else ""
    yield f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<title>{esc(title)}</title><style>{_asset("report.css")}</style></head>
<body>
<h1>{esc(title)}</h1><div class="meta">generated {generated} · {len(page.rows)} tasks{source}</div>
<div class="requests">{requests}</div>
<div class="controls">
<input id="f-q" type="search" placeholder="filter: task id, category, error" aria-label="search">
<select id="f-state" aria-label="state"><option value="">any state</option><option>passed</option>
<option>failed</option><option>error</option></select>
<select id="f-request" aria-label="request"><option value="">any request</option>{options}</select>
{change_filter}{integrity_filter}<span id="shown" class="meta"></span></div>
<table id="tasks"><thead><tr>{heads}</tr></thead><tbody></tbody></table><div id="more" class="meta"></div>
<script id="agentcompass-data" type="application/json">"""
    # As json.dumps({"columns", "rows", "details", "requests"}) would write it, each detail encoded once, when added.
    yield _script_safe(_json({"columns": columns, "rows": page.rows})[:-1])
    page.rows = []
    yield ',"details":['
    group: list[str] = []
    separator = ""
    for text in page.detail_texts():
        group.append(text)
        if len(group) == _DETAILS_PER_CHUNK:
            yield separator + _script_safe(",".join(group))
            group, separator = [], ","
    if group:
        yield separator + _script_safe(",".join(group))
    yield _script_safe(f'],"requests":{_json(page.requests)}}}')
    yield f"""</script>
<script>{_asset("report.js")}</script>
</body></html>
"""


def _count_details(run_dir: Path) -> int:
    return len(DetailFiles(run_dir).detail_ids())


class _Page:
    """Collects rows, details and request blocks, holding the page to its budget."""

    def __init__(self, link_base: Path, baseline: Baseline | None, total_tasks: int) -> None:
        self.link_base = link_base
        self._prefixes: dict[Path, str] = {}
        self._stores: dict[Path, DetailFiles] = {}
        self.baseline = baseline
        # Per-text clip: generous for a few tasks, tight for thousands.
        self.clip = max(160, min(8000, PAGE_BUDGET // max(1, total_tasks * 6)))
        self.spent = 0
        self.rows: list[list[Any]] = []
        #: Integrity findings per row (a column of its own only when some task has any).
        self.integrity: list[int] = []
        #: Each task's detail for the page, in page order, run by run: compact JSON (a string holds far
        #: less than the dict it came from) for a run read from disk; for a run whose records are in
        #: memory, their ids, each detail encoded only as the page is written (:meth:`detail_texts`).
        self.details: list[list[str] | tuple[Path, PageRecords, list[str]]] = []
        self.requests: list[dict[str, Any]] = []

    def add_run(self, run_dir: Path, index: int, known: Sequence[Mapping[str, Any]] | None = None) -> str:
        summary = _read(run_dir / "summary.json")
        info = _read(run_dir / "run_info.json", head=True)
        name = str(summary.get("request") or info.get("request") or run_dir.parent.name)
        order = {str(t.get("task_id")): n for n, t in enumerate(summary.get("tasks", []))}
        details: Iterable[Mapping[str, Any]]
        texts: list[str] | None = []
        if known is None:
            details = _read_details(self._store(run_dir), order)
        else:
            last = len(order)

            def shown_before(task_id: str) -> tuple[int, str]:
                return order.get(task_id, last), task_id

            if isinstance(known, PageRecords):  # sorted by task id, each decoded when reached
                ids = known.order(shown_before)
                details, texts = map(known.record, ids), None
                self.details.append((run_dir, known, ids))
            else:
                details = sorted(known, key=lambda d: shown_before(str(d.get("task_id"))))
        if texts is not None:
            self.details.append(texts)
        changes: dict[str, str] = {}
        if self.baseline is not None:
            old = self.baseline.request(name) or {}
            changes = compare(old, read_run_tasks(run_dir)[1]).change_of() if old else {}
        default_change = "unchanged" if self.baseline is not None and self.baseline.request(name) else "new"
        scores: list[float] = []
        states = {"passed": 0, "failed": 0, "error": 0}
        for detail in details:
            state = state_of(str(detail.get("status", "")), bool(detail.get("passed")))
            states[state] += 1
            if state != "error" and isinstance(detail.get("score"), int | float):
                scores.append(float(detail["score"]))
            self._add_task(
                run_dir,
                len(self.requests),
                detail,
                state,
                changes.get(str(detail.get("task_id")), default_change),
                texts,
            )
        metrics = summary.get("metrics") or {}
        gates = _gates_of(info, name)
        self.requests.append({"name": name, "run_id": run_dir.name})
        return request_block(name, run_dir, info, summary, metrics, states, gates, scores)

    def _add_task(
        self,
        run_dir: Path,
        request: int,
        detail: Mapping[str, Any],
        state: str,
        change: str,
        texts: list[str] | None,
    ) -> None:
        """The task's row; its detail's text into ``texts`` (``None``: encoded later, by :meth:`detail_texts`)."""
        task_id = str(detail.get("task_id"))
        error = detail.get("error") or ""
        error = error.head if isinstance(error, Cut) else str(error)
        metadata = detail.get("metadata") or {}
        usage = metadata.get("usage") if isinstance(metadata, dict) else None
        tokens = usage.get("total_tokens") if isinstance(usage, dict) else None
        row = [
            request,
            task_id,
            detail.get("category"),
            state,
            detail.get("score"),
            detail.get("attempts"),
            detail.get("retries"),
            detail.get("duration"),
            tokens,
            error.strip().splitlines()[0][:200] if error.strip() else "",
        ]
        if self.baseline is not None:
            row.append(change)
        self.rows.append(row)
        found = findings_of(metadata)
        self.integrity.append(len(found))
        if texts is not None:
            texts.append(self._detail(run_dir, task_id, detail, found))

    def detail_texts(self) -> Iterator[str]:
        """Every task's detail for the page, in page order; those kept in memory encoded now, one at a time."""
        for part in self.details:
            if isinstance(part, list):
                yield from part
                continue
            run_dir, records, ids = part
            for task_id in ids:
                detail = records.record(task_id)
                yield self._detail(run_dir, task_id, detail, findings_of(detail.get("metadata") or {}))
        self.details = []

    def _detail(self, run_dir: Path, task_id: str, detail: Mapping[str, Any], found: list[str]) -> str:
        # task ids are safe in a link (checked at load)
        link = self._run_link(run_dir) + self._store(run_dir).place(task_id)
        if self.spent >= PAGE_BUDGET:
            omitted = {"detail": link, "omitted": "details omitted to keep the page small: open the detail record"}
            return _json({**omitted, "integrity": found[:20]} if found else omitted)
        clip = self.clip
        out: dict[str, Any] = {
            "detail": link,
            "output": _clip(detail.get("output"), clip),
            "error": _clip(detail.get("error"), clip),
            "trace": _clip(detail.get("trace"), clip * 2),
            "notes": [_clip(n, clip) for n in detail.get("notes") or []],
            "integrity": [_clip(f, clip) for f in found],
            "attempts": [
                f"attempt {i}: {a.get('status')} score={a.get('score')}"
                + (f" error={_clip(a.get('error'), clip)}" if a.get("error") else "")
                for i, a in (detail.get("attempt_results") or {}).items()
                if isinstance(a, dict)
            ],
        }
        if detail.get("retries"):
            out["retries"] = [
                f"attempt {r.get('attempt_index')} retry {r.get('retry_number')} ({r.get('stage')}): "
                + _clip(r.get("error"), clip)
                for r in _iter_json(sorted((run_dir / "retry_details" / task_id).glob("*.json")))
            ]
        artifacts, conversation = self._artifacts(run_dir, detail)
        out["artifacts"] = artifacts
        out["conversation"] = conversation
        text = _json(out)
        self.spent += len(text) + _separators(out)  # the length json.dumps(out) has: what the budget counts
        return text

    def _artifacts(self, run_dir: Path, detail: Mapping[str, Any]) -> tuple[list[list[Any]], list[list[str]]]:
        artifacts = detail.get("artifacts") or {}
        metadata = detail.get("metadata") or {}
        rows: list[list[Any]] = []
        conversation: list[list[str]] = []
        for name, value in artifacts.items() if isinstance(artifacts, dict) else ():
            path = _existing_file(run_dir, value)
            rows.append([str(name), self._link(path) if path else None, "" if path else _clip(value, 200)])
        for source in (
            artifacts.get("trajectory") if isinstance(artifacts, dict) else None,
            metadata.get("trajectory") if isinstance(metadata, dict) else None,
            detail.get("trajectory"),
        ):
            conversation = _conversation(run_dir, source, self.clip)
            if conversation:
                break
        return rows, conversation

    def _run_link(self, run_dir: Path) -> str:
        """The link prefix of files in ``run_dir`` ("" or ".../"): one ``relpath`` per run, not per task."""
        prefix = self._prefixes.get(run_dir)
        if prefix is None:
            link = self._link(run_dir)
            prefix = self._prefixes[run_dir] = "" if link == "." else link + "/"
        return prefix

    def _store(self, run_dir: Path) -> DetailFiles:
        """The reader of ``run_dir``'s details, which knows their layout (one per run, not per task)."""
        store = self._stores.get(run_dir)
        if store is None:
            store = self._stores[run_dir] = DetailFiles(run_dir)
        return store

    def _link(self, path: Path) -> str:
        try:
            return Path(os.path.relpath(path, self.link_base)).as_posix()
        except ValueError:  # another drive
            return path.resolve().as_uri()


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), default=str)


def _separators(value: Any) -> int:
    """The characters json.dumps' default separators (", " and ": ") add to ``value``'s compact form."""
    if isinstance(value, dict):
        return 2 * len(value) - 1 + sum(map(_separators, value.values())) if value else 0
    if isinstance(value, list | tuple):
        return len(value) - 1 + sum(map(_separators, value)) if value else 0
    return 0


def _gates_of(info: Mapping[str, Any], name: str) -> dict[str, float]:
    for req in (info.get("config") or {}).get("requests") or []:
        if isinstance(req, dict) and req.get("name") == name:
            return dict(req.get("gates") or {})
    return {}


def _conversation(run_dir: Path, source: Any, clip: int) -> list[list[str]]:
    """``[role, text]`` pairs from a trajectory: a file path, an events record or a message list."""
    path = _existing_file(run_dir, source)
    if path is not None:
        if path.stat().st_size > TRAJECTORY_MAX_BYTES:
            return [["note", f"trajectory of {path.stat().st_size} bytes: open {path.name}"]]
        source = _read(path)
    messages: list[Any] = []
    if isinstance(source, dict):
        if isinstance(source.get("events"), list):
            for event in source["events"]:
                if isinstance(event, dict) and "message" in event:
                    messages.append(event["message"])
                elif isinstance(event, dict) and event.get("type") == "error":
                    messages.append({"role": "error", "content": event.get("error")})
        elif isinstance(source.get("messages"), list):
            messages = source["messages"]
    elif isinstance(source, list):
        messages = source
    out: list[list[str]] = []
    for message in messages[-60:] if len(messages) > 60 else messages:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if isinstance(content, list):  # content parts
            content = "\n".join(str(p.get("text", p)) if isinstance(p, dict) else str(p) for p in content)
        text = "" if content is None else str(content)
        for call in message.get("tool_calls") or ():
            function = call.get("function", {}) if isinstance(call, dict) else {}
            text += f"\n-> {function.get('name')}({function.get('arguments')})"
        out.append([str(message.get("role", "?")), _clip(text, clip * 2)])
    if len(messages) > 60:
        out.insert(0, ["note", f"{len(messages) - 60} earlier message(s) not shown"])
    return out


def _existing_file(run_dir: Path, value: Any) -> Path | None:
    if not isinstance(value, str) or not value or len(value) > 4096 or "\n" in value:
        return None
    path = Path(value)
    path = path if path.is_absolute() else run_dir / path
    with contextlib.suppress(OSError):
        if path.is_file():
            return path
    return None


def _read_details(store: DetailFiles, order: Mapping[str, int]) -> list[dict[str, Any]]:
    """The run's readable details in the summary's task order, then by task id: read in the order shown."""
    last = len(order)
    ids = sorted(store.detail_ids(), key=lambda task_id: (order.get(task_id, last), task_id))
    return [d for d in map(store.read_detail, ids) if d]


def _iter_json(paths: Iterable[Path]) -> Iterable[dict[str, Any]]:
    for path in paths:
        data = _read(path)
        if data:
            yield data


def _read(path: str | Path, *, head: bool = False) -> dict[str, Any]:
    """``path``'s JSON object, or ``{}``; ``head``: ``run_info.json`` without its plans (not shown)."""
    try:
        if head:
            data = read_run_info_head(path)
        else:
            with open(path, "rb") as fh:
                data = json.loads(fh.read())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
