"""Live progress while tasks run: pytest's per-item line is too quiet for hour-long tasks.

On a TTY the status trails the current terminal line and is redrawn in
place; elsewhere (CI logs) a plain line is written every ``interval``
seconds. ``-q`` turns it off.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from ..runtime.request import RequestRuntime

__all__ = ["Progress", "ProgressMode", "format_duration", "say_line"]

ProgressMode = Literal["auto", "tty", "lines", "off"]

_SAVE, _RESTORE, _CLEAR_EOL = "\x1b7", "\x1b8", "\x1b[K"


def say_line(terminal: Any, text: str, **markup: bool) -> None:
    """``text`` on a line of its own, even after ``-q``'s progress line (``..  [100%]``).

    pytest's ``write_line`` only ends lines its reporter knows it left open,
    which the quiet progress line is not.
    """
    writer = getattr(terminal, "_tw", None)
    if getattr(writer, "width_of_current_line", 0):
        writer.line()  # type: ignore[union-attr]
    terminal.write_line(text, **markup)


def format_duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Progress:
    """Renders orchestration progress onto pytest's terminal writer."""

    def __init__(self, terminal: Any, mode: ProgressMode = "auto", interval: float | None = None) -> None:
        self.terminal = terminal
        tty = bool(terminal is not None and terminal.isatty())
        if mode == "auto":
            mode = "tty" if tty else "lines"
        self.mode: ProgressMode = mode if terminal is not None else "off"
        self.interval = interval if interval is not None else (1.0 if self.mode == "tty" else 30.0)
        self.started = time.monotonic()
        self.retries = 0
        self._last_line = self.started  # the first line after one interval: a short run prints none
        self._drawn = False

    @property
    def enabled(self) -> bool:
        return self.mode != "off"

    def on_retry(self, task_id: str, stage: str) -> None:
        self.retries += 1

    def status(self, states: Sequence[RequestRuntime], permits: dict[str, int]) -> str:
        done = total = running = 0
        parts = []
        for state in states:
            finished = sum(1 for t in state.wanted if t in state.outcomes)
            done += finished
            total += len(state.wanted)
            running += len(state.active)
            parts.append(f"{state.name} {finished}/{len(state.wanted)}")
        elapsed = time.monotonic() - self.started
        line = f"agentcompass: {done}/{total} done, {running} running"
        if self.retries:
            from ..reports.terminal import many  # with the summary's wording; loaded by the time a line is due

            line += f", {many(self.retries, 'retry', 'retries')}"
        used = ", ".join(label for label, in_use in permits.items() if in_use)
        if used:
            line += f", permits: {used}"
        line += f" | {'; '.join(parts)} | {format_duration(elapsed)}"
        new = done - sum(
            1
            for s in states
            for o in s.outcomes.values()
            if (o.carried_over or o.resumed) and o.task.task_id in s.wanted
        )
        if 0 < new and done < total:
            eta = elapsed / max(new, 1) * (total - done)
            line += f", ETA {format_duration(eta)}"
        return line

    def tick(self, states: Sequence[RequestRuntime], permits: dict[str, int]) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if self.mode == "lines":
            if now - self._last_line < self.interval:
                return
            self._last_line = now
            self.terminal.write_line(f"[{self.status(states, permits)}]")
            return
        writer = self.terminal._tw
        room = writer.fullwidth - writer.width_of_current_line - 3
        if room < 20:
            return
        text = self.status(states, permits)[:room]
        # Drawn after the cursor and restored, so the next report overwrites it;
        # written around pytest's writer so its line-width bookkeeping stays right.
        self._raw(f"{_SAVE}  {text}{_CLEAR_EOL}{_RESTORE}")
        self._drawn = True

    def clear(self) -> None:
        if self._drawn:
            self._raw(_CLEAR_EOL)
            self._drawn = False

    def _raw(self, text: str) -> None:
        stream = self.terminal._tw._file
        stream.write(text)
        stream.flush()
