"""A Ctrl-C or SIGTERM that reaches the xdist controller: the run still ends as it would in process.

The workers cancel their tasks within the cleanup grace (the controller tells
them, for a signal sent to it alone); a second Ctrl-C while they wind down is
said, not raised, so that xdist's teardown, the junit file and the run's
record all happen; and every task no worker reported (a worker's reports die
with it) is reported here as a setup error, as a task cut short in process is.
"""

from __future__ import annotations

import signal
import threading
from typing import TYPE_CHECKING, Any

import pytest

from ..runtime.driver import TERMINATED_REASON, Terminated, write_stderr
from .outcomes import NotRunText, ProblemText, shown

if TYPE_CHECKING:
    from ..vocabulary.types import TaskSpec
    from .controller import ControllerRun

__all__ = ["ControllerInterrupts"]


class ControllerInterrupts:
    """The controller's hooks for a Ctrl-C (registered beside :class:`~.controller.ControllerRun`)."""

    def __init__(self, controller: ControllerRun) -> None:
        self.controller = controller
        #: A Ctrl-C or SIGTERM has interrupted the session: the next Ctrl-C is held.
        self.interrupted = False
        self._held = 0
        #: SIGINT's handler before the controller took it over (see pytest_sessionstart).
        self._previous_sigint: Any = None
        #: SIGTERM's, held while the workers wind down after a Ctrl-C or SIGTERM.
        self._previous_sigterm: Any = None

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """From here on, Ctrl-C on the controller counts its presses (see :meth:`_on_sigint`).

        Taken over before the first press, not after it: a second press that
        came before the first one's ``KeyboardInterrupt`` was handled would
        otherwise find pytest's default handler and end xdist's teardown.
        """
        if threading.current_thread() is threading.main_thread():
            self._previous_sigint = signal.signal(signal.SIGINT, self._on_sigint)

    def _on_sigint(self, signum: int, frame: object) -> None:
        """The first Ctrl-C interrupts as pytest's default does; a second, while the workers
        wind down, is said, not raised; a third leaves at once.

        The workers leave at once on their own second SIGINT (a terminal sends it
        to them too). Raised while they wind down, it would end xdist's teardown,
        which waits for them, and skip everything after it: the junit file, the
        run's summary and the ``interrupted`` record, as without xdist it does not.
        """
        if not self.interrupted:
            self.interrupted = True
            raise KeyboardInterrupt
        self._held += 1
        if self._held > 1:
            raise KeyboardInterrupt
        write_stderr("\nagentcompass: exiting as soon as the workers stop; recording the run\n")

    def pytest_keyboard_interrupt(self, excinfo: Any) -> None:
        """The workers cancel their tasks, within the cleanup grace (a Ctrl-C or a SIGTERM here).

        Before ``pytest_sessionfinish``, where xdist tears the workers down.
        A Ctrl-C in a terminal reaches the workers too; ``kill -INT`` only this process.
        """
        self.interrupted = True
        if isinstance(getattr(excinfo, "value", None), Terminated):
            self.controller.interrupt_reason = TERMINATED_REASON
        self._hold_sigterm()
        service = self.controller.service
        if service is not None:
            service.stop_all(self.controller.interrupt_reason, interrupt=True)

    def _hold_sigterm(self) -> None:
        """A SIGTERM while the workers wind down is said, not obeyed: its default would end the
        controller before it records the run (run_info would say running)."""
        if threading.current_thread() is not threading.main_thread() or self._previous_sigterm is not None:
            return

        def on_sigterm(signum: int, frame: object) -> None:
            write_stderr("\nagentcompass: terminated (SIGTERM); recording the run as soon as the workers stop\n")

        if signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN:
            self._previous_sigterm = signal.signal(signal.SIGTERM, on_sigterm)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self._previous_sigint is not None:
            signal.signal(signal.SIGINT, self._previous_sigint)
            self._previous_sigint = None
        if self._previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None

    # (pytest takes hook implementations only from names starting with "pytest_")
    @pytest.hookimpl(tryfirst=True, specname="pytest_sessionfinish")
    def pytest_sessionfinish_report_unreported(self, session: pytest.Session, exitstatus: int) -> None:
        """An interrupted run: every task no worker reported is an error, in the counts and in junit.

        As in process, where a task that was running or not yet started when
        Ctrl-C came ends as a setup error. First among the session-finish
        hooks: junit's writes its file in its own.
        """
        if exitstatus != pytest.ExitCode.INTERRUPTED:
            return
        if session.shouldfail or session.shouldstop:
            return  # -x or --maxfail: what never ran is not reported, as with pytest's own loop
        controller = self.controller
        hook = session.config.hook
        tasks_of: dict[str, dict[str, TaskSpec]] = {}
        for nodeid in dict.fromkeys(controller.task_nodeids):
            if nodeid in controller.reported:
                continue
            path, _, name = nodeid.partition("::")
            request, _, task_id = name.partition("::")
            state = controller.states.get(request)
            if state is not None and state.store.has_detail(task_id):
                continue  # it ended on its worker, whose report was lost: the summary counts it from its detail
            location = (path, None, name)
            why: object = ProblemText(f"cancelled: {controller.interrupt_reason}")
            if state is not None and state.failed is not None:
                # Its request failed before the Ctrl-C: that is what it reports, as in process.
                if request not in tasks_of:  # once per request, not a scan per task
                    tasks_of[request] = {t.task_id: t for t in state.tasks}
                task = tasks_of[request].get(task_id)
                if task is not None:
                    failed = state.not_run(task)
                    why = NotRunText(shown(str(failed.result.error)), shown(controller.run.redactor.text(state.failed)))
            hook.pytest_runtest_logstart(nodeid=nodeid, location=location)
            for when, outcome, longrepr in (
                ("setup", "failed", why),
                ("teardown", "passed", None),
            ):
                report = pytest.TestReport(nodeid, location, {}, outcome, longrepr, when)  # type: ignore[arg-type]
                hook.pytest_runtest_logreport(report=report)
            hook.pytest_runtest_logfinish(nodeid=nodeid, location=location)
        # These errors count towards -x/--maxfail in pytest's session (which
        # cannot be undone): the run is still recorded interrupted, not stopped.
        controller.interrupt_reported = True
