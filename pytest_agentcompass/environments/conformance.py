"""A conformance kit for Environment providers.

Subclass :class:`EnvironmentConformance` in your provider's test suite,
implement :meth:`~EnvironmentConformance.make_provider` and
:meth:`~EnvironmentConformance.leaked`, and pytest collects the checks::

    class TestMyProvider(EnvironmentConformance):
        def make_provider(self, tmp_path):
            return MyEnvironment(EnvironmentSpec(id="mine", params={...}))

        def leaked(self, provider, tmp_path):
            return list_my_sandboxes(label="agentcompass")

The checks cover idempotent close, cleanup after a failed or cancelled open,
cancellation during exec (also right after it starts) and close, process trees
(an exec returns when its first process exits; a child that escaped into its
own session, or cleared its environment, still dies at the timeout), and the network-policy transition rules.
They need ``sh``, ``setsid``, ``env``, ``sleep`` and ``cat`` in the sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from ..vocabulary.errors import PolicyError
from ..vocabulary.types import ExecutionPlan, NetworkPolicy
from .base import BaseEnvironment, EnvironmentSession

__all__ = ["EnvironmentConformance", "make_plan"]

T = TypeVar("T")
POLICIES: tuple[NetworkPolicy, ...] = ("full", "disabled")


def make_plan(
    baseline: NetworkPolicy = "full",
    run: NetworkPolicy = "full",
    evaluation: NetworkPolicy = "full",
    mode: Any = "reuse",
) -> ExecutionPlan:
    """A minimal plan for provider tests."""
    return ExecutionPlan(
        task_id="conformance",
        attempt_index=0,
        evaluation_environment_mode=mode,
        baseline_network_policy=baseline,
        run_network_policy=run,
        evaluation_network_policy=evaluation,
    )


def _run(factory: Callable[[], Awaitable[T]], provider: BaseEnvironment | None = None) -> T:
    """Run a scenario on a new loop, then close ``provider`` as a run does after its last task.

    What a provider keeps between sessions for the next one (a client, an
    emptied workspace) is released by its ``aclose``; the leak checks come after it.
    """

    async def main() -> T:
        try:
            result = await factory()
        except BaseException:
            if provider is not None:
                with contextlib.suppress(Exception):  # the scenario's own failure is the one to see
                    await provider.aclose()
            raise
        if provider is not None:
            await provider.aclose()
        return result

    return asyncio.run(main())


class EnvironmentConformance:
    """The checks every provider must pass. Methods named ``test_*`` are collected by pytest."""

    #: Seconds a simple command may take (raise for slow sandboxes).
    exec_budget: float = 30.0

    def make_provider(self, tmp_path: Path) -> BaseEnvironment:
        raise NotImplementedError("return the provider under test")

    def leaked(self, provider: BaseEnvironment, tmp_path: Path) -> list[Any]:
        """Resources of ``provider`` still alive (workspaces, containers, processes) after ``aclose``."""
        raise NotImplementedError("list what the provider left behind")

    def labels(self) -> dict[str, str]:
        """Labels given to every session the checks open (for :meth:`leaked` to find them)."""
        return {"agentcompass.conformance": "1"}

    # -- helpers -------------------------------------------------------------
    async def _open(self, provider: BaseEnvironment, plan: ExecutionPlan | None = None) -> EnvironmentSession:
        return await provider.open(provider.build_config(plan or make_plan(), "task", self.labels()))

    async def _exists(self, session: EnvironmentSession, path: str) -> bool:
        return (await session.exec(["sh", "-c", f"test -e {path}"], timeout=self.exec_budget)).exit_code == 0

    async def _running(self, session: EnvironmentSession, pidfile: str) -> bool:
        """Whether the process whose pid is in ``pidfile`` still runs (a zombie does not), seen from the sandbox.

        An empty ``pidfile`` means its shell was killed between creating the
        file and writing its pid (a cancel right after the start does that):
        nothing to find. Checked before the lookup, since ``/proc//stat`` is
        the kernel's own statistics file, whose first line read as a running
        process (a false "still running" for ten seconds, seen in CI).
        """
        probe = (
            f"p=$(cat {pidfile}) || exit 2; "
            'case "$p" in ""|*[!0-9]*) exit 1;; esac; s=; '
            '[ -r /proc/$p/stat ] && read -r _ _ s _ < /proc/$p/stat; [ -n "$s" ] && [ "$s" != Z ]'
        )
        result = await session.exec(["sh", "-c", probe], timeout=self.exec_budget)
        assert result.exit_code in (0, 1), f"cannot probe {pidfile}: {result.stderr}"
        return result.exit_code == 0

    # -- checks -----------------------------------------------------------------
    def test_open_exec_close_leaves_nothing(self, tmp_path: Path) -> None:
        provider = self.make_provider(tmp_path)

        async def scenario() -> None:
            session = await self._open(provider)
            try:
                await session.write_text("probe.txt", "hello")
                assert await session.read_text("probe.txt") == "hello"
                result = await session.exec(["sh", "-c", "cat probe.txt"], timeout=self.exec_budget)
                assert result.exit_code == 0 and result.stdout == "hello"
            finally:  # a failed check must not leave the environment behind
                await session.close()

        _run(scenario, provider)
        assert self.leaked(provider, tmp_path) == []

    def test_close_is_idempotent(self, tmp_path: Path) -> None:
        provider = self.make_provider(tmp_path)

        async def scenario() -> None:
            session = await self._open(provider)
            await session.close()
            await session.close()

        _run(scenario, provider)
        assert self.leaked(provider, tmp_path) == []

    def test_exec_timeout_is_reported(self, tmp_path: Path) -> None:
        provider = self.make_provider(tmp_path)

        async def scenario() -> None:
            session = await self._open(provider)
            try:
                result = await session.exec(["sleep", "30"], timeout=0.5)
                assert result.timed_out
            finally:
                await session.close()

        _run(scenario, provider)
        assert self.leaked(provider, tmp_path) == []

    @pytest.mark.parametrize("ticks", [0, 1, 2, 5, 20])
    def test_cancel_during_open_leaves_nothing(self, tmp_path: Path, ticks: int) -> None:
        provider = self.make_provider(tmp_path)

        async def scenario() -> None:
            task = asyncio.ensure_future(self._open(provider))
            for _ in range(ticks):
                await asyncio.sleep(0)
            task.cancel()
            try:
                session = await task
            except asyncio.CancelledError:
                return
            await session.close()  # open won the race: the runtime closes it at once

        _run(scenario, provider)
        assert self.leaked(provider, tmp_path) == []

    def test_cancel_during_exec_leaves_nothing(self, tmp_path: Path) -> None:
        provider = self.make_provider(tmp_path)

        async def scenario() -> None:
            session = await self._open(provider)
            try:
                task = asyncio.ensure_future(session.exec(["sleep", "30"]))
                await asyncio.sleep(0.3)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            finally:
                await session.close()

        _run(scenario, provider)
        assert self.leaked(provider, tmp_path) == []

    def test_exec_returns_when_its_first_process_exits(self, tmp_path: Path) -> None:
        """A background child holding stdout does not keep the exec waiting (nor make it a timeout)."""
        provider = self.make_provider(tmp_path)

        async def scenario() -> None:
            session = await self._open(provider)
            try:
                script = "sh -c 'sleep 20; echo x > finished' & echo started"
                result = await session.exec(["sh", "-c", script], timeout=self.exec_budget)
                assert (result.exit_code, result.stdout, result.timed_out) == (0, "started\n", False)
                # Had the exec waited for the pipes, the child would have finished first.
                assert not await self._exists(session, "finished")
            finally:
                await session.close()

        _run(scenario, provider)
        assert self.leaked(provider, tmp_path) == []

    def test_escaped_child_dies_at_the_timeout(self, tmp_path: Path) -> None:
        """A child in its own session, keeping stdout, is killed when the exec times out."""
        provider = self.make_provider(tmp_path)

        async def scenario() -> None:
            session = await self._open(provider)
            try:
                script = "setsid sh -c 'echo $$ > escaped.pid; sleep 20; echo x > finished' & sleep 30"
                result = await session.exec(["sh", "-c", script], timeout=2)
                assert result.timed_out
                assert not await self._exists(session, "finished")
                assert not await self._still_running_after(session, "escaped.pid", seconds=10)
            finally:
                await session.close()

        _run(scenario, provider)
        assert self.leaked(provider, tmp_path) == []

    #: A command that clears its environment: nothing of the provider's (a marker variable) is left to find it by.
    BARE_SLEEP = "exec env -i sleep 100"

    def test_timeout_holds_for_a_command_that_clears_its_environment(self, tmp_path: Path) -> None:
        """The exec returns at its timeout, timed out, whatever the command did to its environment."""
        provider = self.make_provider(tmp_path)

        async def scenario() -> None:
            session = await self._open(provider)
            try:
                loop = asyncio.get_running_loop()
                started = loop.time()
                result = await session.exec(["sh", "-c", self.BARE_SLEEP], timeout=2)
                assert result.timed_out
                assert loop.time() - started < 20  # generous: the command alone would take 100 s
            finally:
                await session.close()

        _run(scenario, provider)
        assert self.leaked(provider, tmp_path) == []

    def test_cancel_holds_for_a_command_that_clears_its_environment(self, tmp_path: Path) -> None:
        """A cancel of such a command raises CancelledError promptly."""
        provider = self.make_provider(tmp_path)

        async def scenario() -> None:
            session = await self._open(provider)
            try:
                loop = asyncio.get_running_loop()
                task = asyncio.ensure_future(session.exec(["sh", "-c", self.BARE_SLEEP]))
                await asyncio.sleep(1)
                cancelled = loop.time()
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                assert loop.time() - cancelled < 20
            finally:
                await session.close()

        _run(scenario, provider)
        assert self.leaked(provider, tmp_path) == []

    def test_escaped_child_without_environment_dies_at_the_timeout(self, tmp_path: Path) -> None:
        """A child in its own session and with an empty environment does not outlive the exec's timeout."""
        provider = self.make_provider(tmp_path)

        async def scenario() -> None:
            session = await self._open(provider)
            try:
                script = (
                    "env -i setsid sh -c 'echo $$ > bare.pid; exec sleep 300' & "
                    "while [ ! -s bare.pid ]; do sleep 0.1; done; exec sleep 100"
                )
                result = await session.exec(["sh", "-c", script], timeout=2)
                assert result.timed_out
                if await self._exists(session, "bare.pid"):  # else killed before it wrote (a loaded machine)
                    assert not await self._still_running_after(session, "bare.pid", seconds=10)
            finally:
                await session.close()

        _run(scenario, provider)
        assert self.leaked(provider, tmp_path) == []

    @pytest.mark.parametrize("ticks", [0, 1, 2, 5])
    def test_cancel_right_after_exec_starts(self, tmp_path: Path, ticks: int) -> None:
        """The cancel returns without waiting for the command, and the command is gone."""
        provider = self.make_provider(tmp_path)

        async def scenario() -> None:
            session = await self._open(provider)
            try:
                task = asyncio.ensure_future(
                    session.exec(["sh", "-c", "echo $$ > cancelled.pid; sleep 20; echo x > finished"])
                )
                for _ in range(ticks):
                    await asyncio.sleep(0)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                assert not await self._exists(session, "finished")
                if await self._exists(session, "cancelled.pid"):
                    # The kill is delivered by the cancel; the process may take a
                    # moment to be reaped on a busy machine, but it must go.
                    assert not await self._still_running_after(session, "cancelled.pid", seconds=10)
            finally:
                await session.close()

        _run(scenario, provider)
        assert self.leaked(provider, tmp_path) == []

    async def _still_running_after(self, session: EnvironmentSession, pid_file: str, *, seconds: float) -> bool:
        """Whether the process named in ``pid_file`` is still alive after waiting up to ``seconds``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while await self._running(session, pid_file):
            if loop.time() >= deadline:
                return True
            await asyncio.sleep(0.1)
        return False

    def test_cancel_during_close_then_close_again(self, tmp_path: Path) -> None:
        provider = self.make_provider(tmp_path)

        async def scenario() -> None:
            session = await self._open(provider)
            task = asyncio.ensure_future(session.close())
            await asyncio.sleep(0)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            await session.close()

        _run(scenario, provider)
        assert self.leaked(provider, tmp_path) == []

    @pytest.mark.parametrize(("baseline", "run", "evaluation"), list(itertools.product(POLICIES, POLICIES, POLICIES)))
    def test_policy_transitions(
        self, tmp_path: Path, baseline: NetworkPolicy, run: NetworkPolicy, evaluation: NetworkPolicy
    ) -> None:
        provider = self.make_provider(tmp_path)
        plan = make_plan(baseline, run, evaluation)
        wanted = {baseline, run, evaluation}
        honourable = wanted <= set(provider.supported_network_policies) and (
            provider.dynamic_network_policy or wanted == {baseline}
        )
        if not honourable:
            with pytest.raises(PolicyError):
                provider.build_config(plan, "task")
            return

        async def scenario() -> None:
            session = await self._open(provider, plan)
            try:
                assert session.network_policy == baseline
                for policy in (run, evaluation, baseline):
                    if session.network_policy != policy:
                        await session.set_network_policy(policy)
                    assert session.network_policy == policy
            finally:
                await session.close()

        _run(scenario, provider)
        assert self.leaked(provider, tmp_path) == []
