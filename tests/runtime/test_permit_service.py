"""The permit service that makes limits run-wide under xdist, over its real Unix socket."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_agentcompass.concurrency.limits import RemotePermits, RemoteRateLimiter
from pytest_agentcompass.concurrency.permits import PermitClient, PermitService


@pytest.fixture
def service() -> Iterator[PermitService]:
    svc = PermitService()
    yield svc
    svc.close()
    with pytest.raises(OSError):  # nothing listens there any more
        PermitClient(svc.address)


def test_a_service_killed_by_sigkill_leaves_no_file(tmp_path: Path) -> None:
    code = (
        "from pytest_agentcompass.concurrency.permits import PermitService\n"
        "s = PermitService()\nprint(s.address, flush=True)\ninput()"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert proc.stdout is not None
    address = proc.stdout.readline().rstrip("\n")
    PermitClient(address).close()  # it serves
    proc.kill()
    proc.wait()
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(OSError):
        PermitClient(address)


def test_permits_are_counted_over_clients_first_come_first_served(service: PermitService) -> None:
    async def scenario() -> list[str]:
        one, two = PermitClient(service.address), PermitClient(service.address)
        order: list[str] = []
        try:
            await one.acquire("k", 2)
            await two.acquire("k", 2)
            waiting = [asyncio.ensure_future(c.acquire("k", 2)) for c in (two, one)]
            for future, name in zip(waiting, ("two", "one"), strict=True):
                future.add_done_callback(lambda _, name=name: order.append(name))
            await asyncio.sleep(0.05)
            assert not any(f.done() for f in waiting), "both permits are held"
            one.release("k")
            await waiting[0]
            two.release("k")
            await waiting[1]
            return order
        finally:
            one.close()
            two.close()

    assert asyncio.run(scenario()) == ["two", "one"]
    assert service.peak["k"] == 2


def test_a_cancelled_waiter_takes_nothing(service: PermitService) -> None:
    async def scenario() -> None:
        client = PermitClient(service.address)
        try:
            await client.acquire("k", 1)
            waiter = asyncio.ensure_future(client.acquire("k", 1))
            await asyncio.sleep(0.05)
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            client.release("k")
            await asyncio.wait_for(client.acquire("k", 1), 30)  # the permit is free again
        finally:
            client.close()

    asyncio.run(scenario())


def test_a_killed_holder_frees_its_permits(service: PermitService) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import asyncio, sys
                from pytest_agentcompass.concurrency.permits import PermitClient

                async def main():
                    client = PermitClient({service.address!r})
                    await client.acquire("k", 1)
                    print("held", flush=True)
                    await asyncio.sleep(3600)

                asyncio.run(main())
                """
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "held"

    async def scenario() -> None:
        client = PermitClient(service.address)
        try:
            waiter = asyncio.ensure_future(client.acquire("k", 1))
            await asyncio.sleep(0.05)
            assert not waiter.done(), "the other process holds the only permit"
            os.kill(holder.pid, signal.SIGKILL)
            holder.wait()
            await asyncio.wait_for(waiter, 60)
        finally:
            client.close()

    asyncio.run(scenario())


def test_open_slots_are_spaced_run_wide(service: PermitService) -> None:
    async def scenario() -> list[float]:
        one, two = PermitClient(service.address), PermitClient(service.address)
        try:
            # 0.01 per second: slots 100 s apart, so the computed delays are far from any scheduling noise.
            return [await client.slot_delay("open", 0.01) for client in (one, two, one)]
        finally:
            one.close()
            two.close()

    first, second, third = asyncio.run(scenario())
    assert first == 0
    assert 90 < second <= 100
    assert 190 < third <= 200


def test_remote_limits_keep_the_smallest_limit_and_skip_the_service_when_unlimited(service: PermitService) -> None:
    async def scenario() -> None:
        client = PermitClient(service.address)
        try:
            unlimited = RemotePermits(client, "capacity:x", 0)
            for _ in range(5):
                await unlimited.acquire()
            assert unlimited.in_use == 5 and service.peak["capacity:x"] == 0, "no round trip when unlimited"
            for _ in range(5):
                unlimited.release()
            limited = RemotePermits(client, "capacity:y", 1)
            await limited.acquire()
            waiter = asyncio.ensure_future(limited.acquire())
            await asyncio.sleep(0.05)
            assert not waiter.done()
            limited.release()
            await asyncio.wait_for(waiter, 30)
            limited.release()
            rate = RemoteRateLimiter(client, "open:z", 0)
            await rate.wait()  # unlimited: returns at once
        finally:
            client.close()

    asyncio.run(scenario())


def test_stop_reaches_every_process_including_later_ones(service: PermitService) -> None:
    import queue
    import time

    seen: queue.SimpleQueue[tuple[str, bool]] = queue.SimpleQueue()
    early = PermitClient(service.address)
    early.on_stop = lambda reason, interrupt: seen.put((reason, interrupt))
    late: PermitClient | None = None
    try:
        service.stop_all("stopping after 1 failures")
        assert seen.get(timeout=60) == ("stopping after 1 failures", False)
        late = PermitClient(service.address)  # a replacement worker joins after the stop
        for _ in range(6000):  # a guard, not a measurement
            if late.stopped:
                break
            time.sleep(0.01)
        assert late.stopped == "stopping after 1 failures" and not late.interrupted
        # A Ctrl-C after -x still reaches everyone (running tasks are cancelled); a second one is nothing new.
        service.stop_all("interrupted by the user", interrupt=True)
        service.stop_all("interrupted by the user", interrupt=True)
        assert seen.get(timeout=60) == ("interrupted by the user", True)
        assert seen.empty()
    finally:
        early.close()
        if late is not None:
            late.close()


def test_a_grant_for_a_cancelled_wait_after_the_service_is_gone_is_dropped_quietly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader thread gave such a grant back, to a service already gone: an exception in that thread,
    printed with its traceback in the middle of a Ctrl-C'd xdist run."""
    failures: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: failures.append(args.exc_value))
    address = str(tmp_path / "s")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(address)
    server.listen(1)

    async def scenario() -> None:
        client = PermitClient(address)
        conn, _ = server.accept()
        try:
            waiter = asyncio.ensure_future(client.acquire("k", 1))
            await asyncio.sleep(0.05)
            waiter.cancel()  # cancelled while its acquire is in flight
            with pytest.raises(asyncio.CancelledError):
                await waiter
            lines = b""
            while lines.count(b"\n") < 2:  # "acquire 0 k 1", then "cancel 0"
                lines += await asyncio.to_thread(conn.recv, 100)
            assert lines.split() == [b"acquire", b"0", b"k", b"1", b"cancel", b"0"]
            conn.sendall(b"grant 0\n")  # the grant crossed the cancel, then the service went away
            conn.close()
            await asyncio.to_thread(client._reader.join, 30)
            assert not client._reader.is_alive()
        finally:
            client.close()
            server.close()

    asyncio.run(scenario())
    assert failures == []


def test_a_permit_given_back_after_the_service_is_gone_is_no_error(service: PermitService) -> None:
    """A task's slot released after the controller's service closed (a Ctrl-C'd run ending) raised in its worker."""

    async def scenario() -> None:
        client = PermitClient(service.address)
        try:
            permits = RemotePermits(client, "capacity:x", 1)
            await permits.acquire()
            service.close()
            await asyncio.to_thread(client._reader.join, 30)  # the reader saw the service go
            permits.release()
            assert permits.in_use == 0
        finally:
            client.close()

    asyncio.run(scenario())
