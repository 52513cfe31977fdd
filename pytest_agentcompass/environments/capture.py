"""One output stream of a command: the first bytes kept, the rest counted, never held.

Providers keep ``output_limit`` bytes of each stream. What they drop is
counted in characters, as the whole stream would decode (UTF-8, invalid bytes
replaced), so that whoever shows the output can say exactly how much is
missing (the shell agent's ``[... N characters omitted ...]``): the kept text
and the dropped count add up to the stream decoded in one piece, a character
the limit cut in two counting with the dropped part.
"""

from __future__ import annotations

import codecs

__all__ = ["StreamCapture"]

_Decoder = codecs.getincrementaldecoder("utf-8")


class StreamCapture:
    """Feed chunks with :meth:`add`; read :meth:`text`, :attr:`cut` and :attr:`omitted` at the end."""

    __slots__ = ("_decoder", "_done", "kept", "limit", "omitted")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.kept = bytearray()
        #: Characters past the limit (final once :meth:`text` was called).
        self.omitted = 0
        self._decoder: codecs.IncrementalDecoder | None = None  # set once the limit is reached
        self._done = False

    @property
    def cut(self) -> bool:
        """Whether the stream went past the limit."""
        return self._decoder is not None

    def add(self, chunk: bytes) -> None:
        room = self.limit - len(self.kept)
        if len(chunk) <= room:
            self.kept += chunk
            return
        if room > 0:
            self.kept += chunk[:room]
            chunk = chunk[room:]
        decoder = self._decoder
        if decoder is None:
            # Once per cut stream: the decoder learns where the kept bytes leave off.
            decoder = self._decoder = _Decoder("replace")
            decoder.decode(bytes(self.kept))
        if chunk.isascii() and not decoder.getstate()[0]:
            self.omitted += len(chunk)  # a flood of plain text costs no decoding
        else:
            self.omitted += len(decoder.decode(chunk))

    def text(self) -> str:
        """The kept bytes as text (a character cut by the limit is left to :attr:`omitted`)."""
        if self._decoder is None:
            return self.kept.decode("utf-8", "replace")
        if not self._done:
            self._done = True
            self.omitted += len(self._decoder.decode(b"", final=True))
        return _Decoder("replace").decode(bytes(self.kept))
