"""hostd's data port: routers' ModelInfer calls as HostdData.Infer messages on plain TCP connections
(ground/framelink.py), each connection served exactly as a HostdData.Infer stream is (hostd/forwarded.py's
`serve`: the same data plane, decoding, bounds and answers). HostdSettings.data_port; advertised in the host's
status (HostStatus.data_port), which is how routers find it. A hostd with TLS serves its links with TLS too
(ground/link_tls.py): the same certificate, and with mutual TLS the same check of the router's certificate,
before anything on the connection is read.

A connection that does not start with the link's MAGIC within framelink.OPEN_S, or sends a message over the limit, or one that cannot
be read, is closed, and so is one whose TLS handshake fails or whose certificate names no router: nothing on it
can be answered (the router fails the calls out on it as a host that went away). On stop, the port stops taking
connections and the open ones are closed after the drain (hostd's drain waits for the requests in flight
first)."""

from __future__ import annotations

import asyncio
import logging

from grpc import aio

from ground import link_tls
from ground.framelink import MAGIC, OPEN_S, TooLarge, read_message, write_message
from hostd import forwarded
from hostd.dataplane import DataPlane

log = logging.getLogger(__name__)


class _LinkContext:
    """What `forwarded.serve` needs of a gRPC stream's context, on a connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, limit: int) -> None:
        self._reader, self._writer, self._limit = reader, writer, limit

    async def read(self):
        try:
            message = await read_message(self._reader, self._limit)
        except (TooLarge, asyncio.IncompleteReadError, ConnectionError) as e:
            log.warning("data link from %s: %s; closing it", self._writer.get_extra_info("peername"), e)
            self._writer.close()
            raise ConnectionAbortedError(str(e)) from None
        return aio.EOF if not message else message  # None: closed; b"": END (the router's last message)

    async def write(self, message: bytes) -> None:
        write_message(self._writer, message)
        await self._writer.drain()

    def set_trailing_metadata(self, metadata) -> None:
        pass  # a link has no trailers: abort closes it

    async def abort(self, code, details: str) -> None:
        log.warning("data link from %s: %s; closing it", self._writer.get_extra_info("peername"), details)
        self._writer.close()
        raise ConnectionAbortedError(details)


class DataPort:
    def __init__(self, plane: DataPlane, default_tenant: str | None, max_message_bytes: int,
                 tls: link_tls.LinkServerTLS | None = None, open_s: float = OPEN_S) -> None:
        self._plane, self._default_tenant, self._limit = plane, default_tenant, max_message_bytes
        self._tls, self._open_s = tls, open_s
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        """Listen on `host`:`port` (0: any free port); returns the port."""
        self._server = await asyncio.start_server(self._connection, host, port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            if self._tls is not None and not await link_tls.accept(writer, self._tls):
                return
            try:
                magic = await asyncio.wait_for(reader.readexactly(len(MAGIC)), self._open_s)
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            except asyncio.TimeoutError:
                log.warning("data link from %s: no link header within %g s; closing it",
                            writer.get_extra_info("peername"), self._open_s)
                return
            if magic != MAGIC:
                log.warning("data link from %s: not a router's data link; closing it", writer.get_extra_info("peername"))
                return
            await forwarded.serve(self._plane, self._default_tenant, _LinkContext(reader, writer, self._limit),
                                  self._limit)
        except ConnectionError:
            pass  # the router went away: the calls in flight were cancelled by serve
        except Exception:  # noqa: BLE001 - one connection's failure never reaches the others
            log.exception("data link from %s failed", writer.get_extra_info("peername"))
        finally:
            self._writers.discard(writer)
            writer.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            w.close()
        if self._server is not None:
            try:
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
            except asyncio.TimeoutError:
                pass
