"""Per-task capture of log records and printed output for tasks that run concurrently.

pytest's capture wraps one item's hook calls at a time, which a concurrent
loop never makes; instead, log records and ``print()`` output are routed to
the task whose asyncio context (or worker thread, which copies the context)
emitted them, and shown with that task's report.
"""

from __future__ import annotations

import contextvars
import io
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TextIO

__all__ = ["TaskCapture", "TaskLogHandler", "capture_task_logs", "capture_task_output", "route_task_output"]


@dataclass
class TaskCapture:
    """What one task emitted: formatted log lines and printed text."""

    logs: list[str] = field(default_factory=list)
    output: list[str] = field(default_factory=list)
    output_size: int = 0


_current: contextvars.ContextVar[TaskCapture | None] = contextvars.ContextVar("agentcompass_task_log", default=None)

#: Lines kept per task; a chatty agent must not hold the whole run in memory.
MAX_LINES = 500
#: Printed characters kept per task, for the same reason.
MAX_OUTPUT = 64 * 1024


class TaskLogHandler(logging.Handler):
    """Appends formatted records to the buffer of the task being run, if any."""

    def __init__(self, level: int = logging.NOTSET) -> None:
        super().__init__(level)
        self.setFormatter(logging.Formatter("%(levelname)-8s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        capture = _current.get()
        if capture is None:
            return
        buffer = capture.logs
        if len(buffer) < MAX_LINES:
            buffer.append(self.format(record))
        elif len(buffer) == MAX_LINES:
            buffer.append("... (further log lines dropped)")


class _TaskStream(io.TextIOBase):
    """Stands in for ``sys.stdout``/``sys.stderr`` while tasks run: text written
    from a task's context goes to that task, anything else to the real stream."""

    def __init__(self, real: TextIO) -> None:
        self.real = real

    def write(self, text: str) -> int:
        capture = _current.get()
        if capture is None:
            return self.real.write(text)
        room = MAX_OUTPUT - capture.output_size
        if room > 0:
            capture.output.append(text[:room])
            if len(text) > room:
                capture.output.append("\n... (further output dropped)\n")
        capture.output_size += len(text)
        return len(text)

    def flush(self) -> None:
        self.real.flush()

    def isatty(self) -> bool:
        return self.real.isatty()

    def fileno(self) -> int:
        return self.real.fileno()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


@contextmanager
def route_task_output() -> Iterator[None]:
    """Route ``print()`` from tasks to their own capture for the duration of the block."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _TaskStream(saved[0]), _TaskStream(saved[1])
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


@contextmanager
def capture_task_logs() -> Iterator[TaskCapture]:
    """Collect the log lines and output emitted in this context (and the tasks it starts)."""
    capture = TaskCapture()
    token = _current.set(capture)
    try:
        yield capture
    finally:
        _current.reset(token)


@contextmanager
def capture_task_output(level: int | str | None = None) -> Iterator[None]:
    """While tasks run: their log records and ``print()`` output go to their own captures.

    :param level: The root logger's level meanwhile (pytest's ``--log-level``), if given.
    """
    handler = TaskLogHandler()
    root = logging.getLogger()
    previous = root.level
    if level:
        root.setLevel(level.upper() if isinstance(level, str) else level)
    root.addHandler(handler)
    try:
        with route_task_output():
            yield
    finally:
        root.removeHandler(handler)
        root.setLevel(previous)
