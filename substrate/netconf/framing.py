"""NETCONF over SSH message framing (RFC 6242 section 4), pure and incremental.

- base:1.0 end-of-message framing: a message ends with ``]]>]]>`` (section 4.3). Used for the
  ``<hello>`` exchange and for the whole session when either peer lacks base:1.1.
- base:1.1 chunked framing: ``\\n#<size>\\n<data>`` chunks (size 1..4294967295), the message
  ends with ``\\n##\\n`` (section 4.2). A ``]]>]]>`` inside a message is just data.

A :class:`Deframer` is fed bytes as they arrive and yields complete messages. Malformed framing
raises :class:`FramingError` (RFC 6242: the peer MUST then terminate the session). Sizes are
bounded (:data:`MAX_MESSAGE`), so a peer cannot make the server buffer without limit.
"""

from __future__ import annotations

import re

EOM = b"]]>]]>"
#: Largest message accepted (bytes); larger ones end the session.
MAX_MESSAGE = 16 * 1024 * 1024
#: RFC 6242 section 4.2: chunk-size = 1..4294967295.
MAX_CHUNK = 4294967295
#: Chunk size the server writes.
WRITE_CHUNK = 16 * 1024
_HEADER = re.compile(rb"\n#([1-9][0-9]{0,9})\n")


class FramingError(Exception):
    """The peer's bytes break RFC 6242 framing (or a bound); the session must end."""


def encode_eom(message: bytes) -> bytes:
    """One base:1.0 message."""
    return message + EOM


def encode_chunked(message: bytes, chunk: int = WRITE_CHUNK) -> bytes:
    """One base:1.1 message in chunks of at most ``chunk`` bytes."""
    parts = [b"\n#%d\n%s" % (len(message[i:i + chunk]), message[i:i + chunk]) for i in range(0, len(message), chunk)]
    return b"".join(parts) + b"\n##\n"


class Deframer:
    """Incremental decoder; ``chunked`` switches framing after the hello exchange."""

    def __init__(self, max_message: int = MAX_MESSAGE):
        self.buf = bytearray()
        self.chunked = False
        self.max_message = max_message
        #: the data of the chunks of the message being received (one buffer: a list of chunks
        #: cost about 60 bytes per chunk, so 16 MiB of 1-byte chunks took a gigabyte)
        self._msg = bytearray()
        #: set after the session's first message (the hello, RFC 6242 section 4.1) was returned:
        #: further bytes are only buffered until the caller has chosen the framing (``release``),
        #: so that a chunked message sent right behind the hello is never read as end-of-message
        #: framed. Only the first message holds: a later one that merely mentions "hello" (a
        #: base:1.0 peer's ``message-id="hello"``) must not stall the session.
        self.hold = False
        self._first = True

    def release(self, chunked: bool) -> list[bytes]:
        """Choose the framing after the hello exchange and decode what was buffered meanwhile."""
        self.chunked, self.hold = chunked, False
        return self.feed(b"")

    def feed(self, data: bytes) -> list[bytes]:
        """Add received bytes; return the messages they complete (maybe none).

        Raises:
            FramingError: malformed framing or a message over the bound.
        """
        self.buf += data
        out: list[bytes] = []
        while not self.hold:
            msg = self._next_chunked() if self.chunked else self._next_eom()
            if msg is None:
                break
            out.append(msg)
            if self._first:  # a deframer set to chunked from the start (a client's) has no hello to wait on
                self._first, self.hold = False, not self.chunked
        return out

    def _next_eom(self) -> bytes | None:
        i = self.buf.find(EOM)
        if i < 0:
            if len(self.buf) > self.max_message:
                raise FramingError(f"message longer than {self.max_message} bytes without an end-of-message marker")
            return None
        msg = bytes(self.buf[:i])
        del self.buf[: i + len(EOM)]
        return msg

    def _next_chunked(self) -> bytes | None:
        while True:
            if len(self.buf) < 4:
                return None
            if self.buf[:4] == b"\n##\n":
                if not self._msg:
                    raise FramingError("end-of-chunks marker without any chunk")
                del self.buf[:4]
                msg = bytes(self._msg)
                self._msg = bytearray()
                return msg
            if self.buf[:2] != b"\n#":
                raise FramingError(f"expected a chunk header (\\n#<size>\\n), got {bytes(self.buf[:16])!r}")
            end = self.buf.find(b"\n", 2)
            if end < 0:
                if len(self.buf) > 16:
                    raise FramingError("chunk header too long")
                return None
            m = _HEADER.fullmatch(bytes(self.buf[: end + 1]))
            if not m or int(m.group(1)) > MAX_CHUNK:
                raise FramingError(f"bad chunk header {bytes(self.buf[: end + 1])!r}")
            size = int(m.group(1))
            if len(self._msg) + size > self.max_message:
                raise FramingError(f"message longer than {self.max_message} bytes")
            if len(self.buf) < end + 1 + size:
                return None
            self._msg += self.buf[end + 1: end + 1 + size]
            del self.buf[: end + 1 + size]
