"""The OpenAI-flavoured names of the scripted model server (:mod:`model_upstream`).

The model-calling harness tests were written against a chat-completions-only
server; these helpers build the same protocol-neutral turns that
:mod:`model_upstream` renders in whichever API a request uses.
"""

from __future__ import annotations

import json
from typing import Any

from model_upstream import ScriptedServer, Turn, scripted_server, stall, text, tool

__all__ = ["Reply", "ScriptedServer", "answer", "error", "garbage", "scripted_server", "slow", "stall", "tool_call"]

#: One scripted answer (the name the harness tests use).
Reply = Turn


def answer(
    content: str, *, prompt_tokens: int = 10, completion_tokens: int = 5, delay: float = 0.0, cut: bool = False
) -> Turn:
    """An assistant message without tool calls (``cut``: stopped at the token limit)."""
    turn = text(content, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, delay=delay)
    turn.cut = cut
    return turn


def tool_call(
    command: str | None = None,
    *,
    arguments: str | None = None,
    name: str = "shell",
    content: str | None = None,
    prompt_tokens: int = 20,
    completion_tokens: int = 8,
) -> Turn:
    """An assistant message with one tool call; ``arguments`` overrides the JSON (to send malformed ones)."""
    args: Any = arguments if arguments is not None else json.dumps({"command": command})
    return tool(name, args, content=content, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)


def error(status: int, message: str = "scripted error", kind: str = "server_error") -> Turn:
    return Turn(status=status, error=message, error_type=kind)


def slow(seconds: float, then: Turn | None = None) -> Turn:
    """``then`` (an answer by default), held back ``seconds`` or until the client hangs up."""
    turn = then or answer("late")
    turn.delay = seconds
    return turn


def garbage(raw: bytes | str, content_type: str = "application/json") -> Turn:
    """A 200 answer whose body is ``raw`` as it is: not JSON, or not a chat completion."""
    return Turn(status=200, body=raw.encode() if isinstance(raw, str) else raw, content_type=content_type)


def load_client_modules() -> None:
    """Exercise the ``openai`` client once (answer, error, timeout, refused connection).

    pytester's in-process runs remove every module first imported inside
    them; the client imports parts of its HTTP stack lazily, and a second,
    fresh copy of those parts no longer matches the exception classes the
    first copy raises. Importing them here, at collection, keeps one copy.
    """
    import asyncio

    import openai

    async def calls(url: str, server: ScriptedServer | None) -> None:
        for reply, timeout in ((answer("ok"), 5.0), (error(500), 5.0), (slow(5), 0.05)):
            if server is not None:
                server.push(reply)
            client = openai.AsyncOpenAI(api_key="warm-up", base_url=url, max_retries=0, timeout=timeout)
            try:
                await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
            except openai.OpenAIError:
                pass
            finally:
                await client.close()

    with scripted_server() as server:
        url = server.base_url
        asyncio.run(calls(url, server))
    asyncio.run(calls(url, None))  # the server is gone: refused connections


try:
    load_client_modules()
except ImportError:
    pass  # no openai (or aiohttp): the tests that need them skip themselves
