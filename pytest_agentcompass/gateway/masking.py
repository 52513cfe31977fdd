"""Masking the run's secrets in what the gateway sends back to an agent.

An upstream may quote the key it was sent (``invalid x-api-key: sk-...``) in
an error body or a header; the agent must never see it. Masked: the upstream
key and every secret the run masks (config ``${VAR}`` values, runtime secrets
such as extra upstream header values), as they are and as JSON escapes them,
in every response header value and every body byte the gateway forwards,
streamed bodies included: a secret split across two chunks of a stream is
caught too, because the end of a chunk that could begin a secret is held back
until the next chunk (or the end) tells.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..vocabulary.redact import MASK, MIN_SECRET_LENGTH, Redactor

__all__ = ["SecretMask"]


class SecretMask:
    """Replaces the secrets in bytes and header values with ``***``; one per forwarded answer."""

    def __init__(self, secrets: Iterable[str | None] = ()) -> None:
        own = [s for s in secrets if s and len(s) >= MIN_SECRET_LENGTH]
        self._needles = sorted(
            {s.encode("utf-8", "surrogatepass") for s in Redactor(own).forms()}, key=len, reverse=True
        )
        self._held = b""

    def __bool__(self) -> bool:
        return bool(self._needles)

    def data(self, data: bytes) -> bytes:
        """``data`` with every whole secret masked (no state: a body read whole)."""
        for needle in self._needles:
            if needle in data:
                data = data.replace(needle, MASK.encode())
        return data

    def header(self, value: str) -> str:
        if not self._needles:
            return value
        return self.data(value.encode("utf-8", "surrogateescape")).decode("utf-8", "surrogateescape")

    def chunk(self, chunk: bytes) -> bytes:
        """The part of a stream that can go out now: ``chunk`` after what was held, masked, minus
        an end that may be the beginning of a secret (held for the next chunk)."""
        if not self._needles:
            return chunk
        data = self.data(self._held + chunk)
        keep = self._partial(data)
        self._held = data[len(data) - keep :] if keep else b""
        return data[: len(data) - keep]

    def flush(self) -> bytes:
        """What was held at the end of a stream (no secret: the stream ended inside none)."""
        held, self._held = self._held, b""
        return held

    def _partial(self, data: bytes) -> int:
        """The length of the longest end of ``data`` that is a proper beginning of a secret."""
        for size in range(min(len(data), len(self._needles[0]) - 1), 0, -1):
            tail = data[-size:]
            if any(len(needle) > size and needle.startswith(tail) for needle in self._needles):
                return size
        return 0
