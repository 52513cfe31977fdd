"""Several events in one message (``plugin/wire.py``).

End to end under ``-n 2``: a worker's reports travel together and the
controller replays every one in order; ``--dist worksteal`` is answered while
they are held. Then what those runs cannot time on purpose (a second thread's
event while the main thread holds its own), and the size rule, on the two
functions alone.
"""

from __future__ import annotations

import collections
import json
import pickle
import threading
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from pytest_agentcompass.plugin.keys import EVENTS
from pytest_agentcompass.plugin.wire import (
    MESSAGE_TEXT,
    WIRE,
    packed,
    plain,
    sent_together,
    unpack_events,
    unpacked,
)

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
            if "packed" in kwargs:
                from pytest_agentcompass.plugin.wire import unpacked
                _log(node.config, {"message": name, "events": len(unpacked(kwargs["packed"])), "packed": True})
            else:
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
    # ... each one pickled: plain data, failures' tracebacks and problems included
    assert all(line.get("packed") for line in lines if line.get("message") == "agentcompass_events")
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


#: Users' properties of every kind: an object of theirs (junit writes its str()), a complex, a string
#: with a lone surrogate (undecodable output) that execnet refuses, on three tasks a batch may join.
ODD_PROPERTIES = """

class Weight:
    def __str__(self):
        return "heavy"


def pytest_collection_modifyitems(items):
    odd = {"t5": Weight(), "t6": b"agent wrote \\xff".decode("utf-8", "surrogateescape"), "t7": 2j}
    for item in items:
        item.user_properties.append(("weight", odd.get(item.name, 2.5)))
"""


def test_users_properties_of_any_kind_reach_junit_as_in_one_process(pytester: pytest.Pytester, trace: Path) -> None:
    # Every message goes pickled: the object as its str(), the rest as it was; no worker breaks on a
    # value its batch-mate holds, and junit says what one process's junit says.
    pytester.makeconftest(RECORD_MESSAGES + ODD_PROPERTIES)
    write_config(pytester, [tracing_request("a", trace, n=40, sleep={"run": 0.05})], task_concurrency=20)

    def junit_properties(*args: str) -> dict[str, list[tuple[str, str]]]:
        result = pytester.runpytest_subprocess(
            "--agentcompass=agentcompass.yaml", "--junitxml=j.xml", "-p", "no:randomly", *args, timeout=GUARD
        )
        result.assert_outcomes(passed=40)
        return {
            str(case.get("name")): [(str(p.get("name")), str(p.get("value"))) for p in case.iter("property")]
            for case in ET.parse(pytester.path / "j.xml").getroot().iter("testcase")
        }

    one = junit_properties()
    spread = junit_properties("-n", "2")
    lines = [json.loads(line) for line in (pytester.path / "wire.jsonl").read_text().splitlines()]
    reports = [line for line in lines if line.get("message") in ("agentcompass_events", "testreport")]
    assert reports and all(line.get("packed") for line in reports)
    assert ("weight", "heavy") in one["t5"] and ("weight", "2j") in one["t7"]
    strip = {"agentcompass.detail"}  # each run's own run directory
    assert {name: [p for p in props if p[0] not in strip] for name, props in spread.items()} == {
        name: [p for p in props if p[0] not in strip] for name, props in one.items()
    }


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
    name, kwargs = interactor.sent[1]
    assert name == EVENTS and unpacked(kwargs["packed"]) == [("testreport", report(0)), ("testreport", report(1))]
    on_another_thread(interactor, "unscheduled")  # after the block: the interactor's own method again
    assert interactor.sent[2:] == [("unscheduled", {"indices": []})]


def test_held_events_go_when_the_block_raises_and_one_event_goes_pickled_too() -> None:
    interactor = Interactor()
    with pytest.raises(KeyboardInterrupt), sent_together(interactor):
        interactor.sendevent("logstart", nodeid="t1")
        interactor.sendevent("logfinish", nodeid="t1")
        raise KeyboardInterrupt
    name, kwargs = interactor.sent[0]
    assert name == EVENTS
    assert unpacked(kwargs["packed"]) == [("logstart", {"nodeid": "t1"}), ("logfinish", {"nodeid": "t1"})]
    with sent_together(interactor):
        interactor.sendevent("logstart", nodeid="t0")
    name, kwargs = interactor.sent[1]
    assert name == EVENTS and unpacked(kwargs["packed"]) == [("logstart", {"nodeid": "t0"})]


def test_a_users_object_goes_as_its_str_and_an_earlier_controller_gets_execnets_encoding() -> None:
    class Weight:
        def __str__(self) -> str:
            return "heavy"

    interactor = Interactor()
    with sent_together(interactor):
        interactor.sendevent("testreport", data={"user_properties": [("weight", Weight()), ("ratio", 2j)]})
        interactor.sendevent("logfinish", nodeid="t0")
    name, kwargs = interactor.sent[0]
    assert name == EVENTS
    assert unpacked(kwargs["packed"]) == [
        ("testreport", {"data": {"user_properties": [("weight", "heavy"), ("ratio", 2j)]}}),
        ("logfinish", {"nodeid": "t0"}),
    ]
    with sent_together(interactor, pickled=False):
        interactor.sendevent("logstart", nodeid="t0")
    with sent_together(interactor, pickled=False):
        interactor.sendevent("logstart", nodeid="t1")
        interactor.sendevent("logfinish", nodeid="t1")
    assert interactor.sent[1:] == [
        ("logstart", {"nodeid": "t0"}),
        (EVENTS, {"events": [("logstart", {"nodeid": "t1"}), ("logfinish", {"nodeid": "t1"})]}),
    ]


def test_long_reports_go_before_the_message_grows_past_its_budget() -> None:
    interactor = Interactor()
    long = "x" * (MESSAGE_TEXT // 2 + 1)
    with sent_together(interactor):
        for index in range(5):
            interactor.sendevent("testreport", **report(index, long))
    batches = [unpacked(kwargs["packed"]) if name == EVENTS else [(name, kwargs)] for name, kwargs in interactor.sent]
    assert [len(batch) for batch in batches] == [2, 2, 1]
    order = [event[1]["item_index"] for batch in batches for event in batch]
    assert order == [0, 1, 2, 3, 4]


class Node:
    """What ``unpack_events`` uses of xdist's ``WorkerController``."""

    def __init__(self) -> None:
        self.workerinput: dict[str, Any] = {}
        self.received: list[Any] = []
        self.notified: list[tuple[str, dict[str, Any]]] = []
        self.shut_down = False
        self._down = False

    def process_from_remote(self, eventcall: Any) -> None:
        self.received.append(eventcall)
        if eventcall[0] == "workerfinished":
            self._down = True

    def shutdown(self) -> None:
        self.shut_down = True

    def notify_inproc(self, name: str, **kwargs: Any) -> None:
        self.notified.append((name, kwargs))


def test_the_controller_hands_each_event_to_xdist_in_order_until_the_node_is_down() -> None:
    node = Node()
    unpack_events(node)
    assert node.workerinput[EVENTS] == WIRE
    node.process_from_remote(("logstart", {"nodeid": "t0"}))
    node.process_from_remote(
        (EVENTS, {"events": [["testreport", {"n": 1}], ["workerfinished", {}], ["testreport", {"n": 2}]]})
    )
    assert node.received == [("logstart", {"nodeid": "t0"}), ("testreport", {"n": 1}), ("workerfinished", {})]


def test_the_controller_unpacks_a_pickled_message_too() -> None:
    node = Node()
    unpack_events(node)
    data = packed([("testreport", {"n": 1}), ("workerfinished", {}), ("testreport", {"n": 2})])
    assert data is not None
    node.process_from_remote((EVENTS, {"packed": data}))
    assert node.received == [("testreport", {"n": 1}), ("workerfinished", {})]


class Mine:
    """A user's object in a report: execnet cannot send it either."""


def test_only_plain_data_is_pickled_and_comes_back_as_it_was() -> None:
    location = ("agentcompass.yaml", None, "a::t0")
    properties = [("agentcompass.score", 1.0), ("raw", b"\x00"), ("seen", {1, 2}), ("frozen", frozenset({"x"}))]
    events = [
        ("testreport", {"data": {"location": location, "user_properties": properties, "when": when, "ok": True}})
        for when in ("setup", "call", "teardown")
    ]
    data = packed(events)
    assert data is not None
    back = unpacked(data)
    assert back == events
    # Tuples stay tuples (xdist's own encoding keeps them too), and what was one object stays one.
    assert type(back[0][1]["data"]["location"]) is tuple
    assert back[0][1]["data"]["user_properties"] is back[2][1]["data"]["user_properties"]
    for odd in (Mine(), Path("x"), type("Text", (str,), {})("x"), int, len):
        assert packed([("testreport", {"data": {"user_properties": [("odd", odd)]}})]) is None, odd
        made_plain = plain({"user_properties": [("odd", odd)]})
        assert made_plain == {"user_properties": [("odd", str(odd))]}
        assert packed([("testreport", {"data": made_plain})]) is not None
    data = packed([("testreport", {"data": {"ratio": 2j}})])  # execnet sends a complex too
    assert data is not None and unpacked(data) == [("testreport", {"data": {"ratio": 2j}})]
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    assert packed([("testreport", {"data": deep})]) is None


def test_the_controller_loads_no_class_from_a_message() -> None:
    with pytest.raises(pickle.UnpicklingError, match=r"collections\.OrderedDict: a packed message carries plain data"):
        unpacked(pickle.dumps([("testreport", {"data": collections.OrderedDict()})]))


def test_a_message_the_controller_cannot_read_takes_its_worker_down_saying_why() -> None:
    node = Node()
    unpack_events(node)
    node.process_from_remote((EVENTS, {"packed": b"not a pickle"}))
    assert node.received == [] and node.shut_down and node._down
    ((name, kwargs),) = node.notified
    assert name == "errordown" and kwargs["node"] is node
    assert kwargs["error"].startswith("agentcompass: a message from this worker could not be read (UnpicklingError")
    assert "same version of pytest-agentcompass" in kwargs["error"]
    node.process_from_remote((EVENTS, {"packed": b"still not"}))  # said once
    assert len(node.notified) == 1
