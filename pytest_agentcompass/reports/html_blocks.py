"""The HTML page's block of one request: its counts, metrics, gates and score chart (``reports.html``)."""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..runtime.store.page_records import Cut
from .gate_check import check_gates

__all__ = ["chart", "clip", "esc", "findings_of", "fmt", "request_block"]


def request_block(
    name: str,
    run_dir: Path,
    info: Mapping[str, Any],
    summary: Mapping[str, Any],
    metrics: Mapping[str, Any],
    states: Mapping[str, int],
    gates: Mapping[str, float],
    scores: Sequence[float],
) -> str:
    status = summary.get("status") or info.get("status") or "unknown"
    counts = "".join(f'<span class="{k}">{k}: <b>{v}</b></span>' for k, v in states.items())
    rows = "".join(f"<tr><td>{esc(k)}</td><td>{esc(fmt(v))}</td></tr>" for k, v in metrics.items())
    gate_html = ""
    judged = summary.get("gates")  # the session's verdict (over the whole request), when it recorded one
    if isinstance(judged, dict):
        met, missed, passed = list(judged.get("ok") or []), list(judged.get("missed") or []), bool(judged.get("met"))
    elif gates:
        check = check_gates(name, gates, metrics)
        met, missed, passed = check.met, check.missed, check.passed
    if isinstance(judged, dict) or gates:
        lines = [f'<tr><td class="missed">missed</td><td>{esc(m)}</td></tr>' for m in missed]
        lines += [f"<tr><td>met</td><td>{esc(m)}</td></tr>" for m in met]
        gate_html = f'<h4>gates: {"met" if passed else "MISSED"}</h4><table class="gates">{"".join(lines)}</table>'
        if isinstance(judged, dict) and judged.get("carried_over"):
            gate_html += f'<div class="meta">{esc(judged["carried_over"])} task(s) judged from earlier runs</div>'

    return (
        f'<section class="request" data-request="{esc(name)}"><h2>{esc(name)}</h2>'
        f'<div class="meta">run {esc(run_dir.name)} · {esc(status)}</div>'
        f'<div class="counts">{counts}</div><table class="metrics">{rows}</table>{gate_html}'
        f"{chart(scores, states.get('error', 0))}</section>"
    )


def chart(scores: Sequence[float], errors: int) -> str:
    """An SVG histogram of scores in ten bins over [0, 1], plus a bar for errors.

    Scores outside [0, 1] (any finite float is a score) go to the end bins, and the caption counts them.
    """
    bins = [0] * 10
    outside = 0
    for score in scores:
        if not 0.0 <= score <= 1.0:  # also what int(score * 10) cannot take: 1e308 * 10 is inf
            outside += 1
            score = 0.0 if score < 0 or score != score else 1.0
        bins[min(9, int(score * 10))] += 1
    bars = [*bins, errors]
    top = max(bars) or 1
    width, height, bar = 330, 120, 26
    parts = [
        f'<svg class="chart" role="img" aria-label="score distribution" width="{width}" height="{height + 30}" '
        f'viewBox="0 0 {width} {height + 30}" xmlns="http://www.w3.org/2000/svg">'
    ]
    for i, count in enumerate(bars):
        h = round(count / top * height)
        x = 4 + i * (bar + 3)
        color = "#cf222e" if i == 10 else "#0969da"
        label = "errors" if i == 10 else f"score {i / 10:.1f}-{(i + 1) / 10:.1f}"
        tick = "err" if i == 10 else f"{i / 10:.1f}"
        parts.append(
            f'<rect x="{x}" y="{height - h}" width="{bar}" height="{h}" fill="{color}">'
            f"<title>{label}: {count}</title></rect>"
            f'<text x="{x + bar / 2}" y="{height + 12}" font-size="9" text-anchor="middle">{tick}</text>'
        )
    caption = f"score distribution ({len(scores)} scored" + (f", {outside} outside [0, 1]" if outside else "") + ")"
    parts.append(f'<text x="4" y="{height + 27}" font-size="10">{caption}</text></svg>')
    return "".join(parts)


def findings_of(metadata: Any) -> list[str]:
    """One line per integrity finding recorded in a detail's metadata (see ``runtime.integrity``)."""
    raw = metadata.get("integrity") if isinstance(metadata, dict) else None
    if not raw:
        return []
    if not isinstance(raw, list):
        return [f"malformed: {clip(raw, 200)}"]
    lines = []
    for entry in raw:
        if isinstance(entry, dict):
            path = f" {entry['path']}" if entry.get("path") else ""
            lines.append(f"{entry.get('check')}{path}: {entry.get('message')}")
        else:
            lines.append(f"malformed: {clip(entry, 200)}")
    return lines


def clip(value: Any, limit: int) -> str:
    if value is None:
        return ""
    if isinstance(value, Cut):  # a long text the store kept only the start of, and its length
        text, length = value.head, value.length
    else:
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        length = len(text)
    return text if length <= limit else text[:limit] + f"… [{length - limit} more characters]"


def fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)
