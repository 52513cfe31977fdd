"""Reports on the wire between xdist's processes: what a plain serialization would lose,
and several events in one message.

A not-run task's report carries two parts (``outcomes.NotRunText``): the
pointer the terminal shows and the reason junit writes. xdist sends a
report's ``str()`` alone, and the controller's terminal would print the
request's reason once per task; the two parts travel under their own key.
A task's problem (``outcomes.ProblemText``) travels as its text under a key
of its own too, so the controller's short summary and junit keep its first
line as the reason.

xdist sends each of a worker's events as its own execnet message: six per
task (``logstart``, three reports, ``logfinish``, ``runtest_protocol_complete``),
each one a write and a flush on the worker, a wake-up of the controller's
receiver thread and a hand-over to its main thread. A worker that reports
tasks as they finish, hundreds at a time, sends the events of the tasks it
reports together as one message (:func:`sent_together`); the controller
hands each to xdist exactly as if it had come alone, in the same order
(:func:`unpack_events`). Only when the controller says, in ``workerinput``,
which form of the message it reads (:data:`WIRE`): otherwise every event
goes as xdist sends it.

A task's events travel as one pickle (:func:`packed`), not in execnet's own
serialization: execnet encodes and decodes nested values in Python, a byte
at a time, which cost the controller a quarter of its time for tasks that
only wait; the pickle module does the same in C. The pickle holds built-in
values only (``None``, booleans, numbers, strings, bytes, lists, tuples,
dicts, sets), and the controller's unpickler imports no class and no
function but ``complex``. Any other value (a user's object in
``user_properties``) arrives as its ``str()``, which is what junit writes
of it in one process (:func:`plain`); xdist's own path breaks the worker on
such a value, and on a few that execnet refuses and a pickle carries (a
string holding a lone surrogate, a list that contains itself).
"""

from __future__ import annotations

import contextlib
import io
import pickle
import threading
from collections.abc import Generator, Iterator
from typing import Any

import pytest

from .keys import EVENTS, NOT_RUN, PROBLEM
from .outcomes import NotRunText, ProblemText

__all__ = [
    "MESSAGE_TEXT",
    "WIRE",
    "packed",
    "plain",
    "pytest_report_from_serializable",
    "pytest_report_to_serializable",
    "sent_together",
    "unpack_events",
    "unpacked",
]

#: What :func:`unpack_events` tells workers (``workerinput[EVENTS]``): it reads messages of several
#: events, pickled or in execnet's encoding. A controller of an earlier version said ``True``: read
#: as "not pickled".
WIRE = 2

#: Characters of report text (failures, captured output) one message carries before what is held
#: is sent: tasks with long outputs go a few at a time, and no message grows with the batch.
MESSAGE_TEXT = 4_000_000


@pytest.hookimpl(wrapper=True)
def pytest_report_to_serializable(config: pytest.Config, report: Any) -> Generator[None, Any, Any]:
    """On a worker: a not-run task's report keeps its two parts, a task's problem its text."""
    data = yield
    longrepr = getattr(report, "longrepr", None)
    if isinstance(data, dict) and isinstance(longrepr, NotRunText):
        data[NOT_RUN] = [longrepr.text, longrepr.reason]
    elif isinstance(data, dict) and isinstance(longrepr, ProblemText):
        data[PROBLEM] = longrepr.text
    return data


@pytest.hookimpl(wrapper=True)
def pytest_report_from_serializable(config: pytest.Config, data: Any) -> Generator[None, Any, Any]:
    """On the controller: rebuild what :func:`pytest_report_to_serializable` took apart."""
    parts = data.pop(NOT_RUN, None) if isinstance(data, dict) else None
    problem = data.pop(PROBLEM, None) if isinstance(data, dict) else None
    report = yield
    if parts is not None and report is not None:
        report.longrepr = NotRunText(*parts)
    elif isinstance(problem, str) and report is not None:
        report.longrepr = ProblemText(problem)
    return report


@contextlib.contextmanager
def sent_together(interactor: Any, pickled: bool = True) -> Iterator[None]:
    """On a worker: what xdist's worker plugin sends inside the block goes as one message at its end.

    ``interactor`` is xdist's ``WorkerInteractor``: its hooks call its
    ``sendevent``, which is held back here for the calling thread; other
    threads' events go at once, as before (one that was held could miss the
    message). What was held goes even when the block raises (the events
    happened). ``pickled``: the controller reads pickled messages
    (:data:`WIRE`); the events then go as one pickle, even one alone, a
    value that is not plain data as its ``str()`` (:func:`plain`).
    """
    held: list[tuple[str, dict[str, Any]]] = []
    size = 0
    send = interactor.sendevent
    mine = threading.get_ident()

    def flush() -> None:
        nonlocal size
        data = None
        if pickled and held:  # a user's object somewhere: as its str(), the rest as it was
            data = packed(held) or packed([(name, plain(kwargs)) for name, kwargs in held])
        if data is not None:
            send(EVENTS, packed=data)
        elif len(held) == 1:  # the controller does not read pickles (an earlier version): as xdist sends it
            send(held[0][0], **held[0][1])
        elif held:
            send(EVENTS, events=list(held))
        held.clear()
        size = 0

    def hold(name: str, **kwargs: Any) -> None:
        nonlocal size
        if threading.get_ident() != mine:  # another thread's event (execnet's receiver answering a command,
            send(name, **kwargs)  # the tasks' loop): at once, as before
            return
        held.append((name, kwargs))
        size += _text_size(kwargs.get("data"))
        if size > MESSAGE_TEXT:  # long outputs or tracebacks: what is held goes now, the rest after
            flush()

    interactor.sendevent = hold
    try:
        yield
    finally:
        interactor.sendevent = send
        flush()


def _text_size(data: Any) -> int:
    """Characters a serialized report carries in its failure text and sections (the parts that grow)."""
    if not isinstance(data, dict):
        return 0
    sections = data.get("sections") or ()
    return len(str(data.get("longrepr") or "")) + sum(len(str(part)) for section in sections for part in section)


def unpack_events(node: Any) -> None:
    """On the controller: ``node`` (xdist's ``WorkerController``, before its channel is read)
    passes each event of a worker's :data:`EVENTS` message to xdist on its own, and tells the
    worker it does (``workerinput``)."""
    process = node.process_from_remote

    def process_from_remote(eventcall: Any) -> None:
        if isinstance(eventcall, tuple) and eventcall[0] == EVENTS:
            kwargs = eventcall[1]
            try:
                events = unpacked(kwargs["packed"]) if "packed" in kwargs else kwargs["events"]
            except Exception as exc:  # not what this version's workers send
                _worker_unreadable(node, exc)
                return
            for event in events:
                if getattr(node, "_down", False):  # xdist took the node down on an earlier one: as it would stop
                    return
                process(tuple(event))
        else:
            process(eventcall)

    node.process_from_remote = process_from_remote
    node.workerinput[EVENTS] = WIRE


def _worker_unreadable(node: Any, exc: Exception) -> None:
    """A worker's message the controller cannot read: that worker goes down, saying why once (as
    xdist takes down a worker whose event it cannot handle)."""
    if getattr(node, "_down", False):
        return
    node._down = True  # the channel's end that follows says nothing more
    node.shutdown()
    error = (
        f"agentcompass: a message from this worker could not be read ({type(exc).__name__}: {exc}); "
        "do the controller and the worker run the same version of pytest-agentcompass?"
    )
    node.notify_inproc("errordown", node=node, error=error)


class _NotPlain(Exception):
    """A value other than plain data in what :func:`packed` was given."""


class _PlainPickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        # Called for every object but those of the built-in types the pickle module writes itself
        # (None, bool, int, float, str, bytes, bytearray, dict, list, tuple, set, frozenset): anything
        # else would be a class or a function to import on the controller, but ``complex`` (which
        # execnet sends too).
        if type(obj) is complex or obj is complex:  # a complex is pickled as a call of its type
            return NotImplemented
        raise _NotPlain(type(obj).__name__)


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("builtins", "complex"):
            return complex
        raise pickle.UnpicklingError(f"{module}.{name}: a packed message carries plain data only")


_ATOMS = frozenset({type(None), bool, int, float, complex, str, bytes, bytearray})
#: Containers nested deeper than this become their ``str()`` in :func:`plain` (a list that contains itself).
_DEPTH = 100


def plain(value: Any, depth: int = 0) -> Any:
    """``value`` with every object that is not plain data (built-in values and containers) replaced
    by its ``str()``: what junit writes of a property in one process, and what a pickle carries."""
    kind = type(value)
    if kind in _ATOMS:
        return value
    if depth < _DEPTH:
        if kind is list:
            return [plain(item, depth + 1) for item in value]
        if kind is tuple:
            return tuple(plain(item, depth + 1) for item in value)
        if kind is dict:
            return {plain(key, depth + 1): plain(item, depth + 1) for key, item in value.items()}
        if kind is set or kind is frozenset:
            return kind(plain(item, depth + 1) for item in value)
    try:
        return str(value)
    except Exception:  # a broken __str__: the worker must still report the task
        return object.__repr__(value)


def packed(events: list[tuple[str, dict[str, Any]]]) -> bytes | None:
    """``events`` as one pickle of plain data, or None when they hold any other value (or nest too deep)."""
    buffer = io.BytesIO()
    try:
        _PlainPickler(buffer, protocol=5).dump(events)
    except (_NotPlain, pickle.PicklingError, RecursionError):
        return None
    return buffer.getvalue()


def unpacked(data: bytes) -> list[tuple[str, dict[str, Any]]]:
    """The events :func:`packed` took: values shared on the worker (a report's location, its
    ``user_properties``) are shared again, as they are in one process."""
    events: list[tuple[str, dict[str, Any]]] = _PlainUnpickler(io.BytesIO(data)).load()
    return events
