"""Chunked transfer coding (RFC 9112, 7.1): the body decoder the client and server share."""

from __future__ import annotations

__all__ = ["ChunkError", "ChunkedBody", "ChunksTooLarge"]

#: the longest chunk-size line (size, extensions) accepted
MAX_LINE = 1024


class ChunkError(ValueError):
    """The bytes are not a valid chunked body; the message says what is wrong."""


class ChunksTooLarge(Exception):
    """The chunks add up to more than the limit (known before the chunk is buffered)."""


class ChunkedBody:
    """One chunked body being received: its chunks so far, and their size."""

    __slots__ = ("chunks", "limit", "size")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.chunks: list[bytes] = []
        self.size = 0

    def feed(self, buffer: bytearray, pos: int) -> tuple[int, bytes | None]:
        """Take the complete chunks of ``buffer`` from ``pos``: the position after them, and
        the body once the last chunk and the trailers are in (None until then). The caller
        drops the bytes before the position; after the body they belong to what follows."""
        while True:
            line_end = buffer.find(b"\r\n", pos)
            if line_end < 0:
                if len(buffer) - pos > MAX_LINE:
                    raise ChunkError("chunk size line too long")
                return pos, None
            size_text = bytes(buffer[pos:line_end]).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise ChunkError(f"bad chunk size {size_text[:40]!r}") from None
            if size == 0:  # the last chunk; trailers (ignored) up to an empty line
                end = buffer.find(b"\r\n\r\n", line_end)
                if end < 0:
                    return pos, None
                body = b"".join(self.chunks)
                self.chunks = []
                return end + 4, body
            if self.size + size > self.limit:
                raise ChunksTooLarge(f"more than {self.limit} bytes")
            data_end = line_end + 2 + size
            if len(buffer) < data_end + 2:
                return pos, None
            if buffer[data_end : data_end + 2] != b"\r\n":
                raise ChunkError("chunk not followed by CRLF")
            self.chunks.append(bytes(buffer[line_end + 2 : data_end]))
            self.size += size
            pos = data_end + 2
