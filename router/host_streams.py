"""A router's ModelInfer calls to a hostd, many to a stream (HostdData.Infer: protos/hostd_data.proto,
ground/forwarded.py, hostd/forwarded.py) instead of one gRPC call each: both processes skip gRPC's per-call
work (a call's creation, its metadata and status, its own HTTP/2 stream). docs/router-streams.md has the
measurements that made it the default.

Streams belong to one model on one host (the dispatcher's model key: tenant, model, version): a stream's frames
go out one after another and its answers come back one after another, so a noisy model's backlog must never sit
in front of another model's call, whichever tenant either is. A model gets one stream, and more (up to
`streams`) only while every one it has carries GROW_AT calls or more; a call takes the model's stream with the
fewest out. A model's streams close once it has sent nothing for IDLE_S (`sweep`, on the router's refresh), so
a router that has called thousands of models holds streams only for those in use. A call goes out as a frame
(its seq, tenant, time left and the request bytes unchanged) and its answer frame comes back with the same seq,
in any order (each message carries every frame waiting when it is written: ground/forwarded.py); the answer
says what a unary call's status and trailing metadata would have, so everything above
(router/forward.py's HostError, router/failover.py's rules, the access log) is the same either way.

Failures, as a unary call's transport would have them:
- the stream breaks (the host died, refused the connection, or ended the stream while calls were out): every
  call out on it fails UNAVAILABLE with no mmhost-reason (the host's own reason when the stream ended with
  one), which router/failover.py reads as a host that is down; the next call opens a new stream;
- an answer larger than the router's max_message_bytes ends the stream RESOURCE_EXHAUSTED on the router's side:
  the calls out on it (that model's) fail RESOURCE_EXHAUSTED, final, as the unary call's would, and the host
  stays up (hostd itself answers a call whose answer is over its own send limit RESOURCE_EXHAUSTED, alone);
- a call's deadline passes before its answer: DEADLINE_EXCEEDED here, as gRPC's client would say it (hostd got
  the same deadline in the frame and drops the call from its queue when it passes);
- the caller goes away (the tenant cancelled): its answer is dropped when it comes. hostd is not told (a unary
  call's cancellation reaches it): the call runs to its end there.

A hostd older than the router (no HostdData service: the stream ends UNIMPLEMENTED, with no mmhost-reason) is
called with unary calls, the failed call included, and asked again after a minute: a rolling upgrade may
take the routers first.

A host that advertises a data port (HostStatus.data_port; `set_links`) gets its streams on the data link
instead (ground/framelink.py: the same messages on a TCP connection, with no gRPC call and no completion-queue
trip per message on either side), with mutual TLS when the router has TLS to hostds (`set_tls`:
ground/link_tls.py; a handshake that fails is a link that cannot be connected to). A link that cannot be
connected to fails its calls LinkUnavailable: each goes again on a gRPC stream, and so do that host's next ones for LINK_RETRY_S.
Everything else (matching, deadlines, a broken link as a host that is down, an answer over the limit) is the
same on both.

Big bodies do not take a stream (`max_body_bytes`): one stream's messages go out one after another, so an
8 MB request would hold back every small one behind it on the same stream, where separate calls interleave.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc
from grpc import aio

from ground.forwarded import BATCH_BYTES, METHOD, decode_answer, encode_call, frames, join
from ground.framelink import END, MAGIC, TooLarge, read_message, write_message
from ground.protowire import Malformed
from ground.wire import reason_of
from router.host_client import HostError

log = logging.getLogger(__name__)
_CODES = {c.value[0]: c for c in grpc.StatusCode}
GROW_AT = 4  # calls out on each of a model's streams before it gets another
IDLE_S = 60.0  # a model's streams close when it has sent nothing for this long


class StreamsUnsupported(HostError):
    """The host has no HostdData service (a hostd older than this router, during a rolling upgrade): the call
    goes to it as a unary call instead, and so do the next ones for UNSUPPORTED_RETRY_S."""


UNSUPPORTED_RETRY_S = 60.0


class LinkUnavailable(HostError):
    """The host's data link could not be connected to: the call goes to it on a gRPC stream instead, and so
    do the next ones for LINK_RETRY_S (a host that is down fails there as it would have)."""


LINK_RETRY_S = 60.0
LINK_CONNECT_S = 2.0  # a data link not connected by then (its TLS handshake included) is unavailable


@dataclass(frozen=True)
class Link:
    """Where a host's data link is, and how to reach it: `tls` and `tls_name` (the name its certificate must
    carry) with TLS to hostds, else plaintext."""

    host: str
    port: int
    tls: ssl.SSLContext | None = None
    tls_name: str | None = None


class _LinkCall:
    """A data link connection (ground/framelink.py), with what _Stream uses of a gRPC stream call: iterating
    gives the host's messages, `cancel` ends it; `messages` are written as they come, and the end of them
    half-closes the connection."""

    def __init__(self, link: Link, messages, limit: int) -> None:
        loop = asyncio.get_running_loop()
        self._limit = limit
        self._conn = loop.create_task(self._connect(link))
        self._writer = loop.create_task(self._write(messages))

    @staticmethod
    async def _connect(link: Link) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(link.host, link.port, ssl=link.tls,
                                        server_hostname=link.tls_name if link.tls is not None else None),
                LINK_CONNECT_S)
        except (OSError, asyncio.TimeoutError) as e:  # ssl.SSLError (a failed handshake) is an OSError
            raise LinkUnavailable(grpc.StatusCode.UNAVAILABLE, f"the host's data link {link.host}:{link.port} cannot "
                                  f"be reached ({e or type(e).__name__})") from None
        writer.write(MAGIC)
        return reader, writer

    async def _write(self, messages) -> None:
        try:
            _, writer = await self._conn
        except LinkUnavailable:
            return  # the reader says so
        try:
            async for m in messages:
                write_message(writer, m)
                await writer.drain()
            write_message(writer, END)  # the host answers what is out, then closes
            if writer.can_write_eof():  # not on TLS
                writer.write_eof()
            await writer.drain()
        except OSError:
            writer.close()  # the reader sees the end

    def __aiter__(self):
        return self._messages()

    async def _messages(self):
        reader, writer = await self._conn  # LinkUnavailable
        try:
            while True:
                m = await read_message(reader, self._limit)
                if m is None:
                    return
                yield m
        finally:
            self._writer.cancel()
            writer.close()

    def cancel(self) -> None:
        self._writer.cancel()
        if not self._conn.done():
            self._conn.cancel()
        elif not self._conn.cancelled() and self._conn.exception() is None:
            self._conn.result()[1].close()


class _Stream:
    """One HostdData.Infer call: frames written in order from a queue, answers matched to waiting futures."""

    def __init__(self, channel: aio.Channel, address: str, on_end: Callable[[str], None] | None = None,
                 link: Link | None = None, limit: int = 1 << 62) -> None:
        """`link`: the host's data link, to carry it instead of a gRPC stream; `limit`: the
        largest message taken from a link (a gRPC stream has the channel's)."""
        self.address = address
        self._on_end = on_end  # told "broken", "unsupported" or "link_unreachable" unless it ended by close()
        self.open = True
        self.pending: dict[int, asyncio.Future] = {}
        self._out: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.link = link is not None
        self._call = (channel.stream_stream(METHOD)(self._frames()) if link is None
                      else _LinkCall(link, self._frames(), limit))
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _frames(self):
        """Messages for gRPC to write: each carries the frames queued when it asks for the next, up to
        BATCH_BYTES (a call never waits for others to join it)."""
        out = self._out
        while True:
            frame = await out.get()
            batch, size = [], 0
            while frame is not None:
                batch.append(frame)
                size += len(frame)
                if out.empty() or size >= BATCH_BYTES:  # the rest goes in the next message
                    break
                frame = out.get_nowait()
            if batch:
                yield join(batch)
            if frame is None:  # half-close: the host answers what is out, then ends the stream
                return

    def send(self, seq: int, frame: bytes) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self.pending[seq] = fut
        self._out.put_nowait(frame)
        return fut

    def close(self) -> None:
        """No more calls on it: the ones out are answered, then the stream ends."""
        if self.open:
            self.open = False
            self._out.put_nowait(None)

    def cancel(self) -> None:
        self.open = False
        self._call.cancel()

    async def _read(self) -> None:
        err: HostError
        answered = False
        try:
            async for message in self._call:
                answered = True
                try:
                    answers = [decode_answer(f) for f in frames(message)]
                except Malformed as e:  # not a hostd's answer: nothing on this stream can be trusted
                    err = HostError(grpc.StatusCode.UNAVAILABLE, f"the host's stream sent a malformed answer: {e}")
                    self._call.cancel()
                    break
                pending = self.pending
                for head, response in answers:
                    fut = pending.pop(head.seq, None)
                    if fut is not None and not fut.done():
                        fut.set_result((head, response))
            else:
                err = HostError(grpc.StatusCode.UNAVAILABLE, "the host ended the stream")
        except aio.AioRpcError as e:
            trailing = tuple(e.trailing_metadata() or ())
            if reason_of(trailing) is None and (e.code() == grpc.StatusCode.UNIMPLEMENTED or (
                    e.code() == grpc.StatusCode.INTERNAL and not answered)):
                # a hostd from before HostdData. INTERNAL ("Internal error from Core", no reason) before any
                # answer is the same refusal seen by grpc.aio when its first write raced the host's
                # UNIMPLEMENTED (found in a full test run): either way the host could not serve the stream,
                # and unary calls are always right
                err = StreamsUnsupported(e.code(), e.details() or "", trailing)
            elif e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and reason_of(trailing) is None:
                # an answer over this router's max_message_bytes: as a unary call would, that is final for the
                # calls out on this (one model's) stream, and says nothing about the host
                err = HostError(e.code(), e.details() or "an answer was larger than the router takes", trailing)
            else:
                code = e.code() if reason_of(trailing) is not None else grpc.StatusCode.UNAVAILABLE
                err = HostError(code, e.details() or "the host's stream failed", trailing)
        except LinkUnavailable as e:
            err = e
        except TooLarge as e:  # as a gRPC stream's over-limit message: final for its calls, the host stays up
            err = HostError(grpc.StatusCode.RESOURCE_EXHAUSTED, f"an answer was larger than the router takes ({e})")
        except (ConnectionError, asyncio.IncompleteReadError) as e:
            err = HostError(grpc.StatusCode.UNAVAILABLE, f"the host's data link failed ({type(e).__name__})")
        except asyncio.CancelledError:
            err = HostError(grpc.StatusCode.UNAVAILABLE, "the stream to the host was closed")
        except Exception as e:  # noqa: BLE001 - whatever broke the stream fails its calls, never the router
            log.warning("stream to %s failed", self.address, exc_info=True)
            err = HostError(grpc.StatusCode.UNAVAILABLE, f"the stream to the host failed ({type(e).__name__})")
        ended_by_us = not self.open  # close() or cancel() came first
        self.open = False  # before the sweep: no call joins a stream whose reader is done
        if self._on_end is not None and not ended_by_us:
            self._on_end("unsupported" if isinstance(err, StreamsUnsupported)
                         else "link_unreachable" if isinstance(err, LinkUnavailable) else "broken")
        pending, self.pending = self.pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(err)


class _Pool:
    __slots__ = ("streams", "used")

    def __init__(self) -> None:
        self.streams: list[_Stream] = []
        self.used = 0.0  # when a call last went out


class HostStreams:
    """Calls to hosts over up to `streams` streams per model and host (the Forwarder owns the channels)."""

    def __init__(self, streams: int, max_body_bytes: int, clock=time.monotonic,
                 on_end: Callable[[str], None] | None = None, max_message_bytes: int = 1 << 62) -> None:
        """`on_end`: told the outcome of each stream that ends other than by the router closing it (a metric);
        `max_message_bytes`: the largest message taken from a data link."""
        self.streams = streams
        self._limit = max_message_bytes
        self._links: dict[str, tuple[str, int]] = {}  # address -> its data link (host, port)
        self._tls: tuple[ssl.SSLContext, str] | None = None  # (context, the name hostd certificates carry)
        self._link_down: dict[str, float] = {}  # address -> when its data link could not be reached
        self._on_end = on_end
        self.max_body_bytes = max_body_bytes
        self._clock = clock
        self._pools: dict[tuple[str, str], _Pool] = {}  # (address, lane) -> that model's streams to that host
        self._seq = itertools.count(1)
        self._unsupported: dict[str, float] = {}  # hosts without HostdData -> when that was found

    def takes(self, address: str, body: bytes) -> bool:
        if self.streams <= 0 or len(body) > self.max_body_bytes:
            return False
        since = self._unsupported.get(address)
        if since is None:
            return True
        if self._clock() - since < UNSUPPORTED_RETRY_S:
            return False
        del self._unsupported[address]  # upgraded since? try streams again
        return True

    def set_links(self, ports: dict[str, int]) -> None:
        """The hosts' data ports (address -> port; a host not in it has none): a host whose port changed (it
        restarted) gets new streams."""
        links = {a: (a.rsplit(":", 1)[0].strip("[]"), p) for a, p in ports.items() if p}
        changed = {a for a in set(links) | set(self._links) if links.get(a) != self._links.get(a)}
        self._links = links
        for a in changed:
            self._link_down.pop(a, None)
            self.drop(a)

    def set_tls(self, context: ssl.SSLContext, name: str) -> None:
        """Data links opened from now on go with TLS (`context`), verifying that hosts' certificates carry
        `name` (after a rotation, the Forwarder drops the streams open)."""
        self._tls = (context, name)

    def _link(self, address: str) -> Link | None:
        where = self._links.get(address)
        if where is None:
            return None
        since = self._link_down.get(address)
        if since is not None:
            if self._clock() - since < LINK_RETRY_S:
                return None
            del self._link_down[address]
        if self._tls is None:
            return Link(*where)
        return Link(where[0], where[1], *self._tls)

    def open_streams(self, address: str | None = None) -> int:
        """Streams open (to `address`, or to every host)."""
        return sum(len(p.streams) for (a, _), p in self._pools.items() if address is None or a == address)

    def _stream(self, channel: aio.Channel, address: str, lane: str) -> _Stream:
        pool = self._pools.get((address, lane))
        if pool is None:
            pool = self._pools[address, lane] = _Pool()
        pool.used = self._clock()
        streams = pool.streams
        best = None
        for s in streams:
            if not s.open:
                streams[:] = [s for s in streams if s.open]
                return self._stream(channel, address, lane)
            if best is None or len(s.pending) < len(best.pending):
                best = s
        if best is None or (len(best.pending) >= GROW_AT and len(streams) < self.streams):
            best = _Stream(channel, address, self._on_end, self._link(address), self._limit)
            streams.append(best)
        return best

    async def call(self, channel: aio.Channel, address: str, tenant: str, body: bytes, timeout: float | None,
                   lane: str = "") -> tuple[bytes, Sequence[tuple[str, str]]]:
        """(response bytes, trailing metadata) of one ModelInfer; HostError as a unary call would raise it."""
        if timeout is not None and timeout <= 0:
            raise HostError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        seq = next(self._seq)
        stream = self._stream(channel, address, lane)
        fut = stream.send(seq, encode_call(seq, tenant, int(timeout * 1e6) if timeout is not None else 0, body))
        timer = None
        if timeout is not None:
            timer = asyncio.get_running_loop().call_later(timeout, _expire, fut)
        try:
            head, response = await fut
        except StreamsUnsupported:
            self._unsupported[address] = self._clock()
            self.drop(address)
            raise
        except LinkUnavailable:
            if address not in self._link_down:
                self._link_down[address] = self._clock()
                log.warning("the data link of %s cannot be reached: its calls go on gRPC streams for %.0f s",
                            address, LINK_RETRY_S)
            self._drop_links(address)
            raise
        finally:
            if timer is not None:
                timer.cancel()
            stream.pending.pop(seq, None)
        trailing = tuple((t.key, t.value) for t in head.trailers)
        if head.code:
            raise HostError(_CODES.get(head.code, grpc.StatusCode.UNKNOWN), head.message, trailing)
        return bytes(response), trailing

    def drop(self, address: str | None = None) -> None:
        """Close the streams to `address` (every host's for None): their calls are answered, new calls open
        new streams (on the channel given then)."""
        self._close([k for k in self._pools if address is None or k[0] == address])

    def _drop_links(self, address: str) -> None:
        """Close the address's streams that are data links (its gRPC streams stay)."""
        for (a, _), pool in self._pools.items():
            if a == address:
                for st in pool.streams:
                    if st.link:
                        st.close()
                pool.streams[:] = [st for st in pool.streams if st.open]

    def sweep(self) -> int:
        """Close the streams of models that sent nothing for IDLE_S (their calls out are answered first);
        returns how many closed."""
        cutoff = self._clock() - IDLE_S
        return self._close([k for k, p in self._pools.items() if p.used < cutoff])

    def _close(self, keys: list[tuple[str, str]]) -> int:
        closed = 0
        for key in keys:
            for s in self._pools.pop(key).streams:
                s.close()
                closed += 1
        return closed

    def cancel_all(self) -> None:
        for pool in self._pools.values():
            for s in pool.streams:
                s.cancel()
        self._pools.clear()


def _expire(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_exception(HostError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))
