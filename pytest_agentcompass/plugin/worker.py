"""Running under pytest-xdist (``-n``): a worker's concurrent loop.

xdist's own worker loop runs one item at a time and keeps one item of
lookahead. This loop replaces it on workers (``pytest_runtestloop``) and
speaks the same protocol to the controller:

- commands from the controller (``runtests``, ``shutdown``) arrive on the
  execnet channel; task items go straight to the worker's Orchestrator,
  which runs them concurrently on its own event loop in a second thread,
  the same loop as without xdist (``runtime.driver.drive``), with one
  run-wide permit per running task;
- every finished task is reported from the main thread through the standard
  hooks (``logstart``, setup/call/teardown ``logreport``, ``logfinish``),
  with xdist's current-item index set to that task, then acknowledged with
  ``runtest_protocol_complete``: xdist's worker plugin serializes the
  reports, so terminal output, junit, ``--lf`` and ``-x`` on the controller
  see exactly what they see from xdist's own loop;
- ordinary test items run through the standard protocol in the main thread,
  while the tasks go on in the loop thread.

It relies on the worker plugin's ``channel``, ``sendevent`` and
``item_index`` (pytest-xdist 3.x, the pinned range; a pytester test covers it).
The worker shares each request's run with the controller, which owns it
(``runtime.ownership``); how this fits the other ways a task runs is in
docs/how-it-works.md, "Three ways a task runs".
"""

from __future__ import annotations

import contextlib
import copy
import queue
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ..concurrency.limits import on_run_stop
from ..runtime.driver import TERMINATED_REASON, drive, sigterm_interrupts
from ..runtime.orchestrator import OrchestrationResult
from ..runtime.request import RequestRuntime
from .keys import EVENTS, WORKER_DETAILS, WORKER_FAILED, WORKER_NOTES
from .nodes import TaskItem
from .outcomes import emit_reports
from .wire import WIRE, sent_together

if TYPE_CHECKING:
    from ..vocabulary.outcome import TaskOutcome
    from .keys import RunHandle

__all__ = ["WorkerLoop", "WorkerPlugin", "xdist_worker_plugin"]

_END = object()  # the channel's end marker: the controller is gone
#: Tasks reported in one message at most: the controller's terminal, ``-x`` and the
#: scheduler's next items wait for the message, so it stays small and prompt.
_TOGETHER = 50


def xdist_worker_plugin(config: pytest.Config) -> Any:
    """xdist's worker-side plugin (``WorkerInteractor``), found by what it offers."""
    for plugin in config.pluginmanager.get_plugins():
        if all(hasattr(plugin, name) for name in ("channel", "sendevent", "torun", "handle_command")):
            return plugin
    return None


class WorkerPlugin:
    """Replaces xdist's worker loop with :class:`WorkerLoop` (registered on workers only)."""

    def __init__(self, run: RunHandle, run_dirs: dict[str, str]) -> None:
        self.run = run
        self.run_dirs = run_dirs

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool | None:
        if session.config.option.collectonly:
            return None
        interactor = xdist_worker_plugin(session.config)
        if interactor is None:
            return None  # not an xdist worker after all: the standard loop runs
        return WorkerLoop(self.run, session, interactor, self.run_dirs).run_loop()

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        _ignore_the_teardown_sigint()


class WorkerLoop:
    """One worker's session: receive items, run tasks concurrently, report each one."""

    def __init__(self, run: RunHandle, session: pytest.Session, interactor: Any, run_dirs: dict[str, str]) -> None:
        self.run = run
        self.session = session
        self.interactor = interactor
        self.events: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        #: The controller unpacks several events sent as one message (``wire.sent_together``), and
        #: reads them pickled (``wire.WIRE``; a controller of an earlier version said ``True``).
        wire = getattr(session.config, "workerinput", {}).get(EVENTS)
        self.together = bool(wire)
        self.pickled = wire == WIRE
        self.index_of: dict[tuple[str, str], int] = {}
        self.shutdown = False
        #: Why another process stopped the run (``-x``), if it did.
        self.stopped: str | None = None
        #: A Ctrl-C or SIGTERM reached this process while tasks ran.
        self.interrupted = False
        #: Ctrl-C presses so far (the controller's word counts as the first, a SIGTERM as two).
        self.presses = 0
        items = [i for i in session.items if isinstance(i, TaskItem)]
        # An ordinary test ends with this as ``nextitem``, so session fixtures
        # (which components may come from) stay up while tasks run.
        self.anchor: pytest.Item | None = items[0] if items else None
        self.states = self._runtimes(items, run_dirs)
        self.orchestrator = run.orchestrator(list(self.states.values()), on_outcome=self._finished, fed=True)
        on_run_stop(lambda reason, interrupt: self.events.put(("interrupt" if interrupt else "stop", reason)))

    def _runtimes(self, items: list[TaskItem], run_dirs: dict[str, str]) -> dict[str, RequestRuntime]:
        """The runtime of each request with items, in declaration order, sharing the run the controller owns."""
        setups = {item.request_name: item.setup_info for item in items}
        states = {
            setup.req.name: self.run.shared_runtime(
                setup, Path(run_dirs[setup.req.name]) if setup.req.name in run_dirs else None
            )
            for setup in sorted(setups.values(), key=lambda s: s.index)
        }
        for state in states.values():
            state.store.written = []  # sent to the controller at the end (``_send_notes``)
        return states

    def _send_notes(self) -> None:
        """What this worker's providers learned mid-run (an engine that stopped answering), what
        failed as its requests closed, and the details it wrote, for the controller: it finalizes
        the run and never saw it happen."""
        # Preflight's notes are in the state already (and the controller ran its own preflight).
        notes = {
            name: [n for n in getattr(s.ctx.provider, "notes", ()) if n not in s.notes] + s.closing_notes
            for name, s in self.states.items()
        }
        workeroutput: dict[str, Any] = getattr(self.session.config, "workeroutput", {})
        workeroutput[WORKER_NOTES] = {name: found for name, found in notes.items() if found}
        # A request can fail here alone (its preflight, which the controller passed): its tasks then point
        # at the summary for the reason, which only this worker knows.
        workeroutput[WORKER_FAILED] = {name: s.failed for name, s in self.states.items() if s.failed}
        # Every detail written here, so the controller need not read them back from disk (it still
        # does when a worker was lost, sent none, or the run did not complete: ``ControllerRun._finalize_all``).
        # xdist sends workeroutput at the session's very end; the lists themselves go, so a detail
        # written after this call still would.
        written = {name: s.store.written for name, s in self.states.items()}
        if all(kept is not None for kept in written.values()):  # else more than a message should carry
            workeroutput[WORKER_DETAILS] = written

    # -- threads other than the main one -------------------------------------------------
    def _command(self, command: Any) -> None:
        """execnet's receiver thread: commands become events for the main thread."""
        if command is _END:
            self.events.put(("shutdown", None))
            return
        name, kwargs = command
        if name == "runtests":
            self.events.put(("run", list(kwargs["indices"])))
        elif name == "runtests_all":
            self.events.put(("run", list(range(len(self.session.items)))))
        elif name == "shutdown":
            self.events.put(("shutdown", None))
        elif name == "steal":  # everything handed over is already in the loop: nothing to give back
            self.interactor.sendevent("unscheduled", indices=[])

    def _finished(self, outcome: TaskOutcome) -> None:
        """The loop thread: hand a terminal task to the main thread (a copy: the loop slims its own)."""
        self.events.put(("outcome", copy.copy(outcome)))

    def _drive(self) -> None:
        try:
            self.events.put(("done", drive(self.orchestrator)))
        except BaseException as exc:  # surfaced in the main thread
            self.events.put(("done", exc))

    # -- the main thread ------------------------------------------------------------------
    def run_loop(self) -> bool:
        self.interactor.channel.setcallback(self._command, endmarker=_END)
        thread = threading.Thread(target=self._drive, name="agentcompass-loop", daemon=True)
        try:
            with self.run.task_output(), self._signals_as_events():
                thread.start()
                result = self._serve()
        finally:
            self._send_notes()
        if isinstance(result, BaseException):
            raise result
        session = self.session
        if self.stopped and not (session.shouldfail or session.shouldstop):
            session.shouldstop = self.stopped  # tells the controller why work is left undone
        if session.shouldfail or session.shouldstop:
            # -x: what did not start is not reported, as with xdist's own loop.
            session._setupstate.teardown_exact(None)
            return True
        # Handed over but never run (cancelled, or the loop had ended): reported, never lost.
        self._cancel_leftovers(result)
        if self.interrupted:  # a signal here; the controller's word alone waits for its shutdown below
            raise KeyboardInterrupt
        while not self.shutdown:
            # The deadline passed: the controller may still send work until it sees it is done.
            kind, value = self.events.get()
            if kind == "run":
                self._start(value)
                self._cancel_leftovers(result)
            elif kind == "shutdown":
                self.shutdown = True
        session._setupstate.teardown_exact(None)
        return True

    @contextlib.contextmanager
    def _signals_as_events(self) -> Iterator[None]:
        """Ctrl-C and SIGTERM become events of the main thread's queue while tasks run.

        As in process (runtime/driver.py): the first Ctrl-C cancels within the
        grace, the second skips the grace but not the bookkeeping (the run's
        environments are swept), a third leaves at once; a SIGTERM is the first
        two. Events, not a ``KeyboardInterrupt`` raised wherever the main thread
        is: raised just after it took the loop thread's "done", it lost that, and
        the worker waited for it forever. The orchestrator is told at once, from
        the handler (its calls are thread-safe): an ordinary test running in the
        main thread must not hold the tasks' cancellation back. (``SimpleQueue.put``
        may be called from a signal handler.)
        """
        terminated = False

        def on_sigint(signum: int, frame: object) -> None:
            self.presses += 1
            if self.presses > 2:
                raise KeyboardInterrupt
            self.orchestrator.interrupt()  # idempotent
            if self.presses == 2:
                self.orchestrator.force_threadsafe()
            self.events.put(("signal", self.presses))

        def on_sigterm() -> None:
            nonlocal terminated
            terminated = True
            # What follows is SIGKILL, not a third Ctrl-C: execnet's SIGINT to a
            # worker still busy at teardown must not cut the sweep short.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            self.presses = max(self.presses, 2)
            self.orchestrator.interrupt(TERMINATED_REASON)
            self.orchestrator.force_threadsafe()
            self.events.put(("signal", 2))

        in_main_thread = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, on_sigint) if in_main_thread else None
        try:
            with sigterm_interrupts(on_sigterm):
                yield
        finally:
            if in_main_thread and not terminated:  # after a SIGTERM, SIGINT stays ignored to the end
                signal.signal(signal.SIGINT, signal.default_int_handler if previous is None else previous)

    def _serve(self) -> OrchestrationResult | BaseException:
        """Handle events until the loop thread is done; returns what it returned (or raised)."""
        following: tuple[str, Any] | None = None
        while True:
            kind, value = following or self.events.get()
            following = None
            if kind == "run":
                self._start(value)
            elif kind == "outcome":
                following = self._report_finished(value)
            elif kind == "shutdown":
                self.shutdown = True
                self.orchestrator.close_feed()
            elif kind == "stop":
                self.stopped = value
                self.orchestrator.stop_threadsafe(value)
            elif kind == "interrupt":  # a Ctrl-C reached the controller alone: as if it reached us
                self.presses = max(self.presses, 1)  # so the next SIGINT (execnet's, at teardown) is the second
                self.orchestrator.interrupt(value)
            elif kind == "signal":  # a Ctrl-C or SIGTERM here, already passed on (see _signals_as_events)
                self.interrupted = True
            elif kind == "done":
                return value  # type: ignore[no-any-return]

    def _report_finished(self, outcome: TaskOutcome) -> tuple[str, Any] | None:
        """Report ``outcome`` and every other task that finished meanwhile, up to
        :data:`_TOGETHER`, in one message to the controller; returns the next event
        of another kind, taken off the queue on the way."""
        if not self.together:
            self._report(outcome)
            return None
        with sent_together(self.interactor, self.pickled):
            self._report(outcome)
            for _ in range(_TOGETHER - 1):
                try:
                    kind, value = self.events.get_nowait()
                except queue.Empty:
                    return None
                if kind != "outcome":
                    return kind, value
                self._report(value)
        return None

    def _cancel_leftovers(self, result: OrchestrationResult) -> None:
        items = self.session.items
        for index in list(self.index_of.values()):
            item = items[index]
            assert isinstance(item, TaskItem)
            state = self.states[item.request_name]
            self._report(state.cancelled_outcome(item.task, f"{result.status}: {result.reason or 'not run'}"))

    def _start(self, indices: list[int]) -> None:
        items = self.session.items
        plain = [i for i in indices if not isinstance(items[i], TaskItem)]
        for index in indices:
            item = items[index]
            if isinstance(item, TaskItem):
                state = self.states[item.request_name]
                self.index_of[(item.request_name, item.task.task_id)] = index
                self.orchestrator.submit(state, item.task)
        for position, index in enumerate(plain):
            following = plain[position + 1] if position + 1 < len(plain) else None
            nextitem = items[following] if following is not None else self.anchor
            self._run_plain(index, nextitem)

    def _run_plain(self, index: int, nextitem: pytest.Item | None) -> None:
        """An ordinary test: the standard protocol, as xdist's own loop runs it."""
        self.interactor.item_index = index
        started = time.perf_counter()
        self.run.config.hook.pytest_runtest_protocol(item=self.session.items[index], nextitem=nextitem)
        self._complete(index, time.perf_counter() - started)

    def _report(self, outcome: TaskOutcome) -> None:
        index = self.index_of.pop((outcome.request, outcome.task.task_id), None)
        if index is None:
            return  # not handed to this worker
        item = self.session.items[index]
        assert isinstance(item, TaskItem)
        self.interactor.item_index = index
        self.run.task_finished(item, outcome)
        emit_reports(item, outcome, item.setup_info.req.execution.pass_threshold)
        self._complete(index, outcome.duration)

    def _complete(self, index: int, duration: float) -> None:
        self.interactor.sendevent("runtest_protocol_complete", item_index=index, duration=duration)
        session = self.session
        if session.shouldfail or session.shouldstop:
            self.orchestrator.stop_threadsafe(str(session.shouldfail or session.shouldstop))


def _ignore_the_teardown_sigint() -> None:
    """A worker whose session is over ignores SIGINT from here on, until its process ends.

    Once every worker has said it finished, xdist's controller tells the
    workers' gateways to end, and execnet sends a worker SIGINT if it is
    still busy 5 s later (``WorkerGateway._terminate_execution``). A worker
    has more to do after it said it finished: the other plugins' terminal
    summaries (hypothesis' imports its whole package, 2.5 s on a slow
    machine) and pytest's garbage collections at unconfigure. On a loaded
    machine that outlasts the 5 s, and the ``KeyboardInterrupt`` surfaced
    wherever the worker was ("Exception ignored in ... KeyboardInterrupt").
    Nothing is left to interrupt: every task is reported, the store is
    closed, and a Ctrl-C reaches the controller, which records the run. Not
    restored at unconfigure: the collections run after it.
    """
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
