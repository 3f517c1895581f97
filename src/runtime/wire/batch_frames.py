"""Batch frames: several header-only messages to one peer in one ZeroMQ message.

The transport makes them (transports/zmq_sending.py, zmq_replies.py) and takes them apart
(zmq_receiving.py); the codec only refuses one that reached it (a malformed batch, or a batch
inside a batch) with a message that says so.

Sixty-four asks in flight are 128 ZeroMQ messages, each a send, a receive and the I/O threads'
work on both sides. Messages a process sends to one peer within one turn of its event loop
therefore leave together, as one frame (docs/PROTOCOL.md, section 2.1); on a 2-core host that
takes about a third off the CPU time of an ask with 64 in flight (``troupe bench messaging``):

    0xC1, then for each message: its header's length (4 bytes, little-endian), its header

0xC1 is the one byte msgpack never uses, so no header starts with it: a receiver tells a batch
from a message by its first byte, and a batch inside a batch is a bad frame. Only messages of a
header alone travel batched (a message with buffer frames is sent as it is). A mailbox answers
in batches only to a connection that sent it a batch: a client that never batches never sees one.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

__all__ = [
    "BATCH_MARK",
    "MAX_BATCH_BYTES",
    "MAX_BATCH_MESSAGES",
    "batch_frames",
    "pack_batch",
    "unpack_batch",
]

BATCH_MARK = b"\xc1"
# The most bytes one batch holds: bounded well below any sensible max_message_mb (a receiver's
# ZeroMQ drops the connection of a peer that sends a frame over its limit).
MAX_BATCH_BYTES = 16 * 1024
# The most messages one batch holds: a batch leaves once it has this many, so that the peer
# works on it while more are made (whole turns' batches made the two sides take turns).
MAX_BATCH_MESSAGES = 32
_LENGTH = struct.Struct("<I")
_pack_length = _LENGTH.pack
_unpack_length = _LENGTH.unpack_from


def pack_batch(headers: list[bytes]) -> bytes:
    """One batch frame holding ``headers`` in order."""
    parts = [BATCH_MARK]
    for header in headers:
        parts.append(_pack_length(len(header)))
        parts.append(header)
    return b"".join(parts)


def unpack_batch(frame: bytes) -> list[bytes] | None:
    """The headers of a batch frame, in order; None when it is malformed (empty, over
    ``MAX_BATCH_BYTES``, or a length that runs past its end): the caller then hands the frame
    on as one message, which the codec refuses as a bad frame. The bound keeps a hostile
    peer's frame from becoming millions of messages in one read."""
    end = len(frame)
    if end > MAX_BATCH_BYTES:
        return None
    offset = 1
    headers: list[bytes] = []
    while offset < end:
        if offset + 4 > end:
            return None
        (size,) = _unpack_length(frame, offset)
        offset += 4
        stop = offset + size
        if stop > end:
            return None
        headers.append(frame[offset:stop])
        offset = stop
    return headers or None


def batch_frames(headers: list[bytes]) -> Iterator[tuple[bytes, int]]:
    """``headers`` as frames to send, in order, each with how many messages it holds: a lone
    header as it is, more as batches of at most ``MAX_BATCH_BYTES``."""
    if len(headers) == 1:
        yield headers[0], 1
        return
    start, size = 0, 1
    for i, header in enumerate(headers):
        if size + 4 + len(header) > MAX_BATCH_BYTES and i > start:
            yield _one_or_batch(headers[start:i])
            start, size = i, 1
        size += 4 + len(header)
    yield _one_or_batch(headers[start:])


def _one_or_batch(headers: list[bytes]) -> tuple[bytes, int]:
    return (headers[0] if len(headers) == 1 else pack_batch(headers)), len(headers)
