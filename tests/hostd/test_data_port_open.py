"""hostd's data port bounds a connection's opening: one that sends nothing, or only part of the link's MAGIC,
is closed once framelink.OPEN_S (here shortened) has passed, as gRPC bounds the HTTP/2 preface, instead of
being held open forever; a connection that sent MAGIC is a router's link and stays open while idle. In-process:
a real DataPort on a real socket; no call reaches its data plane."""

from __future__ import annotations

import asyncio

from ground.framelink import MAGIC
from hostd.data_port import DataPort

OPEN_S = 0.3


async def _port() -> tuple[DataPort, int]:
    port = DataPort(None, "acme", 1 << 20, open_s=OPEN_S)  # type: ignore[arg-type]  # no call reaches the plane
    return port, await port.start("127.0.0.1", 0)


async def _closed_by_host(n: int, sent: bytes) -> bool:
    """Connect, send `sent`, and wait (far longer than OPEN_S) for the host to close: True if it did."""
    reader, writer = await asyncio.open_connection("127.0.0.1", n)
    try:
        writer.write(sent)
        await writer.drain()
        try:
            return await asyncio.wait_for(reader.read(100), 10 * OPEN_S + 5) == b""
        except asyncio.TimeoutError:
            return False
    finally:
        writer.close()


def test_a_connection_that_sends_no_link_header_is_closed():
    async def go():
        port, n = await _port()
        try:
            return [await _closed_by_host(n, sent) for sent in (b"", MAGIC[:3])]
        finally:
            await port.close()

    assert asyncio.run(go()) == [True, True]


def test_a_link_that_sent_its_header_stays_open_while_idle_until_the_port_closes():
    async def go():
        port, n = await _port()
        reader, writer = await asyncio.open_connection("127.0.0.1", n)
        try:
            writer.write(MAGIC)
            await writer.drain()
            try:
                early = await asyncio.wait_for(reader.read(100), 5 * OPEN_S)
            except asyncio.TimeoutError:
                early = None  # still open: nothing sent, nothing closed
            await port.close()
            late = await asyncio.wait_for(reader.read(100), 5)
            return early, late
        finally:
            writer.close()

    assert asyncio.run(go()) == (None, b"")
