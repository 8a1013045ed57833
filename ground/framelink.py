"""The data link: HostdData.Infer's messages (ground/forwarded.py's batches of frames) on a plain TCP
connection instead of a gRPC stream, from a router (router/host_streams.py) to a hostd's data port
(hostd/data_port.py).

Why: on a gRPC stream, each message the router writes is a C-core send operation and a trip through grpc.aio's
completion queue on both sides, and frames rarely share a message (a router takes in one tenant call per loop
turn). Measured with `bench/router.py` (50 MB MLP, concurrency 32, 2 cores): the gRPC stream's write alone was
13% of the router's samples; on this link the router's CPU per request fell from 326 to 288 us, hostd's from 503
to 445, and the router kept 0.83x of direct throughput against 0.78x (docs/router-streams.md).

Wire: the client first sends MAGIC, within OPEN_S of connecting (or of its TLS handshake), as gRPC servers
bound the HTTP/2 preface: a connection that sends nothing is closed rather than held. Then each side sends
messages, each a 4-byte little-endian length and that many bytes. A message's bytes are exactly what the gRPC
stream's message would carry (ForwardedCalls from the router, ForwardedAnswers from hostd). When the router has
no more calls it sends END (an empty message, which no ForwardedCalls ever is) and, in plaintext, half-closes
(TCP FIN); hostd answers what is in flight and closes. END is how a TLS link ends its calls (TLS has no
half-close); a hostd from before END reads it as a message with no calls. A length over the reader's limit
ends the connection (TooLarge), as gRPC refuses a message over its receive limit.

With TLS to hostds the link runs inside TLS, from the first byte (ground/link_tls.py)."""

from __future__ import annotations

import asyncio

MAGIC = b"mmhostd\x01"  # the link's version: a hostd refuses a connection that does not start with it
OPEN_S = 10.0  # a connection that has not sent MAGIC by then (after its TLS handshake, if any) is closed
END = b""  # the router's last message: no more calls
_LEN = 4


class TooLarge(Exception):
    """A message longer than the reader takes: the connection cannot go on (its bytes were not read)."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"a message of {size} bytes, over the {limit} this side takes")
        self.size, self.limit = size, limit


async def read_message(reader: asyncio.StreamReader, limit: int) -> bytes | None:
    """The next message (END included), or None when the peer closed (cleanly, between messages). Raises
    TooLarge, or asyncio.IncompleteReadError when the connection ends inside a message."""
    try:
        head = await reader.readexactly(_LEN)
    except asyncio.IncompleteReadError as e:
        if not e.partial:
            return None
        raise
    size = int.from_bytes(head, "little")
    if size > limit:
        raise TooLarge(size, limit)
    return await reader.readexactly(size)


def write_message(writer: asyncio.StreamWriter, message: bytes) -> None:
    """Queue one message on the transport (the caller drains)."""
    writer.writelines((len(message).to_bytes(_LEN, "little"), message))
