"""Per-call overhead of the model harnesses over the bare ``openai`` client.

One loopback server (its own process, so its CPU counts for neither side)
answers every chat completion with the same small body. Two kinds of child
process alternate, each timing its own loop of N sequential calls after a
warm-up:

- ``bare``: ``await client.chat.completions.create(...)`` with ``AsyncOpenAI``;
- ``harness``: ``OpenAIChatHarness.run`` per call (the ``openai`` harness: the
  ChatModel with its connection permit, the trajectory, usage, redaction,
  the RunResult) with ``max_connections`` set so the permit is exercised.

Usage::

    python perf/bench_model_calls.py --calls 1000 --repeat 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from _common import describe_filesystem

BODY = json.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "42"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 13},
    }
).encode()
MESSAGES = [{"role": "user", "content": "6 * 7"}]


def serve(port_file: Path) -> None:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # One segment per answer and no Nagle delay: otherwise every call waits for a delayed ACK (~40 ms).
        wbufsize = 64 * 1024
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(BODY)))
            self.end_headers()
            self.wfile.write(BODY)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    port_file.write_text(str(httpd.server_address[1]))
    httpd.serve_forever()


async def bare(url: str, calls: int, warmup: int) -> tuple[float, float]:
    import openai

    # Same modules loaded on both sides: a larger heap makes every collection dearer.
    import pytest_agentcompass.harnesses.openai_chat  # noqa: F401

    client = openai.AsyncOpenAI(api_key="sk-bench-key", base_url=url, max_retries=0)
    try:
        for _ in range(warmup):
            await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(calls):
            await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
        return time.perf_counter() - wall, time.process_time() - cpu
    finally:
        await client.close()


async def harness(url: str, calls: int, warmup: int) -> tuple[float, float]:
    from pytest_agentcompass import PreparedTask, RunRequest, TaskSpec
    from pytest_agentcompass.harnesses.openai_chat import OpenAIChatHarness

    req = RunRequest.model_validate(
        {
            "name": "bench",
            "benchmark": {"id": "x"},
            "harness": {"id": "openai"},
            "model": {
                "id": "m",
                "params": {"base_url": url, "api_key": "sk-bench-key", "max_retries": 0, "max_connections": 8},
            },
        }
    )
    agent = OpenAIChatHarness()
    agent.preflight(req)
    task = TaskSpec("t0", question="6 * 7")
    prepared = PreparedTask("t0", prompt="6 * 7")

    async def one() -> None:
        result = await agent.run(None, task, prepared, None, req, None)  # type: ignore[arg-type]
        assert result.output == "42", result.error

    try:
        for _ in range(warmup):
            await one()
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(calls):
            await one()
        return time.perf_counter() - wall, time.process_time() - cpu
    finally:
        await agent.aclose()


async def bookkeeping(calls: int) -> tuple[float, float]:
    """What the harness adds around one call, without the network: permit, trajectory, usage, result."""
    from pytest_agentcompass import RunRequest, TaskSpec
    from pytest_agentcompass.harnesses.openai_chat import OpenAIChatHarness
    from pytest_agentcompass.models.client import ChatModel, ChatReply

    req = RunRequest.model_validate(
        {
            "name": "bench",
            "benchmark": {"id": "x"},
            "harness": {"id": "openai"},
            "model": {"id": "m", "params": {"api_key": "sk-bench-key", "max_connections": 8}},
        }
    )
    agent = OpenAIChatHarness()
    agent.preflight(req)
    task = TaskSpec("t0", question="6 * 7")
    model = agent.model(req, task)
    assert isinstance(model, ChatModel)
    usage = {"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 13}
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        trajectory = agent.trajectory(model, task)
        trajectory.message({"role": "user", "content": "6 * 7"})
        async with model.permits.permit():
            reply = ChatReply(content="42", finish_reason="stop", usage=usage, latency=0.001)
        trajectory.model_call(reply)
        trajectory.stop_reason = "answered"
        agent.finish(model, task, trajectory, "42")
    return time.perf_counter() - wall, time.process_time() - cpu


def child(side: str, url: str, calls: int, warmup: int) -> tuple[float, float]:
    """One side in a fresh interpreter: (wall, CPU) of its timed loop."""
    out = subprocess.run(
        [sys.executable, __file__, "--side", side, "--url", url, "--calls", str(calls), "--warmup", str(warmup)],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"{side} run failed:\n{out.stderr}")
    wall, cpu = (float(x) for x in out.stdout.split())
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--side", choices=["bare", "harness", "bookkeeping"], help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    if args.side == "bookkeeping":
        print(*asyncio.run(bookkeeping(args.calls * 10)))
        return
    if args.side:
        run = bare if args.side == "bare" else harness
        wall, cpu = asyncio.run(run(args.url, args.calls, args.warmup))
        print(wall, cpu)
        return
    port_file = Path(f"/tmp/bench-model-calls-{os.getpid()}.port")
    print(f"no run directory: the children only call the server (port file on {describe_filesystem(Path('/tmp'))})")
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port_file)])
    try:
        while not port_file.exists() or not port_file.read_text():
            time.sleep(0.05)
        url = f"http://127.0.0.1:{port_file.read_text()}/v1"
        rows: list[tuple[float, float, float, float]] = []
        for round_ in range(args.repeat):
            # Alternate which side goes first, so neither always runs on a warmer (or busier) machine.
            if round_ % 2 == 0:
                b_wall, b_cpu = child("bare", url, args.calls, args.warmup)
                h_wall, h_cpu = child("harness", url, args.calls, args.warmup)
            else:
                h_wall, h_cpu = child("harness", url, args.calls, args.warmup)
                b_wall, b_cpu = child("bare", url, args.calls, args.warmup)
            rows.append((b_wall, b_cpu, h_wall, h_cpu))
            print(
                f"round {round_ + 1}: bare {b_wall:.3f}s (CPU {b_cpu:.3f}s), harness {h_wall:.3f}s (CPU {h_cpu:.3f}s)"
                f" -> {h_wall / b_wall:.3f}x wall, {h_cpu / b_cpu:.3f}x CPU"
            )
        walls = [h / b for b, _, h, _ in rows]
        cpus = [h / b for _, b, _, h in rows]
        print(f"pairwise wall ratios: {', '.join(f'{r:.2f}' for r in walls)}; median {statistics.median(walls):.2f}x")
        print(f"pairwise CPU ratios:  {', '.join(f'{r:.2f}' for r in cpus)}; median {statistics.median(cpus):.2f}x")
        med = [statistics.median(row[i] for row in rows) for i in range(4)]
        per_call_wall = (med[2] - med[0]) / args.calls * 1e6
        per_call_cpu = (med[3] - med[1]) / args.calls * 1e6
        print(
            f"medians over {args.repeat} round(s) of {args.calls} calls: bare {med[0]:.3f}s (CPU {med[1]:.3f}s), "
            f"harness {med[2]:.3f}s (CPU {med[3]:.3f}s)"
        )
        print(
            f"per call: bare {med[0] / args.calls * 1e6:.0f} us (CPU {med[1] / args.calls * 1e6:.0f} us); "
            f"harness overhead {per_call_wall:+.0f} us wall, {per_call_cpu:+.0f} us CPU "
            f"({med[2] / med[0]:.3f}x wall, {med[3] / med[1]:.3f}x CPU)"
        )
        k_wall, k_cpu = child("bookkeeping", url, args.calls, 0)
        n = args.calls * 10
        print(
            f"harness bookkeeping alone (no network, {n} calls): {k_wall / n * 1e6:.1f} us wall, "
            f"{k_cpu / n * 1e6:.1f} us CPU per call"
        )
    finally:
        server.terminate()
        server.wait()
        port_file.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
