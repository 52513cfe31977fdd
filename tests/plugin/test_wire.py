"""Several events in one message (``plugin/wire.py``).

End to end under ``-n 2``: a worker's reports travel together and the
controller replays every one in order; ``--dist worksteal`` is answered while
they are held. Then what those runs cannot time on purpose (a second thread's
event while the main thread holds its own), and the size rule, on the two
functions alone.
"""

from __future__ import annotations

import json
import threading
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from pytest_agentcompass.plugin.keys import EVENTS
from pytest_agentcompass.plugin.wire import MESSAGE_TEXT, sent_together, unpack_events

from conftest import GUARD, tracing_request, write_config

#: A conftest that records, on the controller, every message a worker's channel delivers (after the
#: plugin wrapped the node: ``trylast``), every report hook (and ``logstart``/``logfinish``) in the order
#: xdist replays them, and holds each worker's first report for half a second.
RECORD_MESSAGES = """
import json, os, time
import pytest

def _log(config, line):
    with open(os.path.join(str(config.rootpath), "wire.jsonl"), "a") as fh:
        fh.write(json.dumps(line) + "\\n")

@pytest.hookimpl(trylast=True)
def pytest_configure_node(node):
    process = node.process_from_remote
    def recorded(eventcall):
        if isinstance(eventcall, tuple):
            name, kwargs = eventcall
            _log(node.config, {"message": name, "events": len(kwargs.get("events", [])) or 1})
        process(eventcall)
    node.process_from_remote = recorded

def pytest_configure(config):
    global CONFIG
    CONFIG = config

def pytest_runtest_logreport(report):
    if not hasattr(CONFIG, "workerinput"):  # the controller's replay
        _log(CONFIG, {"report": report.nodeid, "when": report.when, "outcome": report.outcome})

def pytest_runtest_logstart(nodeid):
    if not hasattr(CONFIG, "workerinput"):
        _log(CONFIG, {"report": nodeid, "when": "logstart", "outcome": ""})
    elif not getattr(CONFIG, "waited", False):
        # A worker's first report waits: the tasks that finish meanwhile are reported with the next.
        CONFIG.waited = True
        time.sleep(0.5)

def pytest_runtest_logfinish(nodeid):
    if not hasattr(CONFIG, "workerinput"):
        _log(CONFIG, {"report": nodeid, "when": "logfinish", "outcome": ""})
"""


def test_a_workers_reports_travel_together_and_arrive_as_sent(pytester: pytest.Pytester, trace: Path) -> None:
    # Hundreds of quick tasks: a worker reports those that finished meanwhile in one message;
    # the controller replays every report, in order, as if each had come alone.
    pytester.makeconftest(RECORD_MESSAGES)
    request = tracing_request("a", trace, n=300, wrong=["t7", "t150"], fail={"run": {"t3": -1, "t299": -1}})
    write_config(pytester, [request], task_concurrency=100)
    result = pytester.runpytest_subprocess(
        "--agentcompass=agentcompass.yaml", "-n", "2", "--junitxml=j.xml", "-p", "no:randomly", timeout=GUARD
    )
    result.assert_outcomes(passed=296, failed=2, errors=2)
    lines = [json.loads(line) for line in (pytester.path / "wire.jsonl").read_text().splitlines()]
    together = [line["events"] for line in lines if line.get("message") == "agentcompass_events"]
    assert together and max(together) > 6, lines[:20]  # more than one task's six events in a message
    # (each worker's first report waited half a second: every task that finished meanwhile came after it)
    per_task: dict[str, list[tuple[str, str]]] = {}
    for line in lines:
        if "report" in line:
            per_task.setdefault(line["report"], []).append((line["when"], line["outcome"]))
    assert len(per_task) == 300
    for nodeid, reports in per_task.items():
        task = nodeid.rsplit("::", 1)[1]
        if task in ("t3", "t299"):
            expected = [("setup", "failed"), ("teardown", "passed")]
        elif task in ("t7", "t150"):
            expected = [("setup", "passed"), ("call", "failed"), ("teardown", "passed")]
        else:
            expected = [("setup", "passed"), ("call", "passed"), ("teardown", "passed")]
        # Each task's hooks in xdist's order, logstart first and logfinish last, once each.
        assert reports == [("logstart", ""), *expected, ("logfinish", "")], (nodeid, reports)
    cases = ET.parse(pytester.path / "j.xml").getroot().iter("testcase")
    assert sorted(case.get("name") for case in cases) == sorted(f"t{i}" for i in range(300))


def test_worksteal_requests_are_answered_while_reports_travel_together(pytester: pytest.Pytester, trace: Path) -> None:
    # --dist worksteal asks a busy worker to give work back; the worker answers from execnet's
    # receiver thread (it keeps what it has: nothing to give) while its main thread holds its own
    # events for one message: the answers go at once, every task is reported.
    pytester.makeconftest(RECORD_MESSAGES)
    write_config(pytester, [tracing_request("a", trace, n=200, sleep={"run": 0.05})], task_concurrency=20)
    result = pytester.runpytest_subprocess(
        "--agentcompass=agentcompass.yaml", "-n", "2", "--dist", "worksteal", "-p", "no:randomly", timeout=GUARD
    )
    result.assert_outcomes(passed=200)
    names = [json.loads(line).get("message") for line in (pytester.path / "wire.jsonl").read_text().splitlines()]
    assert "unscheduled" in names and "agentcompass_events" in names


class Interactor:
    """What ``sent_together`` uses of xdist's ``WorkerInteractor``: its ``sendevent``."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def sendevent(self, name: str, **kwargs: Any) -> None:
        self.sent.append((name, kwargs))


def report(index: int, text: str = "") -> dict[str, Any]:
    return {"data": {"nodeid": f"t{index}", "longrepr": text, "sections": []}, "item_index": index}


def on_another_thread(interactor: Interactor, name: str) -> None:
    thread = threading.Thread(target=lambda: interactor.sendevent(name, indices=[]))
    thread.start()
    thread.join()


def test_the_main_threads_events_go_as_one_message_and_other_threads_at_once() -> None:
    interactor = Interactor()
    with sent_together(interactor):
        interactor.sendevent("testreport", **report(0))
        on_another_thread(interactor, "unscheduled")  # execnet's receiver answering "steal"
        interactor.sendevent("testreport", **report(1))
        assert interactor.sent == [("unscheduled", {"indices": []})]
    assert interactor.sent[1] == (EVENTS, {"events": [("testreport", report(0)), ("testreport", report(1))]})
    on_another_thread(interactor, "unscheduled")  # after the block: the interactor's own method again
    assert interactor.sent[2:] == [("unscheduled", {"indices": []})]


def test_one_event_goes_as_xdist_sends_it_and_held_events_go_when_the_block_raises() -> None:
    interactor = Interactor()
    with sent_together(interactor):
        interactor.sendevent("logstart", nodeid="t0")
    assert interactor.sent == [("logstart", {"nodeid": "t0"})]
    with pytest.raises(KeyboardInterrupt), sent_together(interactor):
        interactor.sendevent("logstart", nodeid="t1")
        interactor.sendevent("logfinish", nodeid="t1")
        raise KeyboardInterrupt
    assert interactor.sent[1] == (EVENTS, {"events": [("logstart", {"nodeid": "t1"}), ("logfinish", {"nodeid": "t1"})]})


def test_long_reports_go_before_the_message_grows_past_its_budget() -> None:
    interactor = Interactor()
    long = "x" * (MESSAGE_TEXT // 2 + 1)
    with sent_together(interactor):
        for index in range(5):
            interactor.sendevent("testreport", **report(index, long))
    sizes = [len(kwargs["events"]) if name == EVENTS else 1 for name, kwargs in interactor.sent]
    assert sizes == [2, 2, 1]
    order = [event[1]["item_index"] for name, kwargs in interactor.sent for event in kwargs.get("events", [])]
    order += [kwargs["item_index"] for name, kwargs in interactor.sent if name != EVENTS]
    assert order == [0, 1, 2, 3, 4]


class Node:
    """What ``unpack_events`` uses of xdist's ``WorkerController``."""

    def __init__(self) -> None:
        self.workerinput: dict[str, Any] = {}
        self.received: list[Any] = []
        self._down = False

    def process_from_remote(self, eventcall: Any) -> None:
        self.received.append(eventcall)
        if eventcall[0] == "workerfinished":
            self._down = True


def test_the_controller_hands_each_event_to_xdist_in_order_until_the_node_is_down() -> None:
    node = Node()
    unpack_events(node)
    assert node.workerinput[EVENTS] is True
    node.process_from_remote(("logstart", {"nodeid": "t0"}))
    node.process_from_remote(
        (EVENTS, {"events": [["testreport", {"n": 1}], ["workerfinished", {}], ["testreport", {"n": 2}]]})
    )
    assert node.received == [("logstart", {"nodeid": "t0"}), ("testreport", {"n": 1}), ("workerfinished", {})]
