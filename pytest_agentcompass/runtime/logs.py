"""Per-task log capture for tasks that run concurrently.

pytest's capture wraps one item's hook calls at a time, which a concurrent
loop never makes; instead, log records are routed to the task whose asyncio
context emitted them, and shown with that task's report.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["TaskLogHandler", "capture_task_logs"]

_current: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("agentcompass_task_log", default=None)

#: Lines kept per task; a chatty agent must not hold the whole run in memory.
MAX_LINES = 500


class TaskLogHandler(logging.Handler):
    """Appends formatted records to the buffer of the task being run, if any."""

    def __init__(self, level: int = logging.NOTSET) -> None:
        super().__init__(level)
        self.setFormatter(logging.Formatter("%(levelname)-8s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        buffer = _current.get()
        if buffer is None:
            return
        if len(buffer) < MAX_LINES:
            buffer.append(self.format(record))
        elif len(buffer) == MAX_LINES:
            buffer.append("... (further log lines dropped)")


@contextmanager
def capture_task_logs() -> Iterator[list[str]]:
    """Collect the log lines emitted in this context (and the tasks it starts)."""
    buffer: list[str] = []
    token = _current.set(buffer)
    try:
        yield buffer
    finally:
        _current.reset(token)
