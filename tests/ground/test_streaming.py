"""ModelStreamInfer's loop (ground/streaming.py) over a fake call: answers as they complete, failures as
answers, the in-flight bound (the stream is not read past it), cancellation of what is in flight when the
call ends, and nothing written after. No sleeps: answers wait on events the test sets."""

from __future__ import annotations

import asyncio

import grpc
from grpc import aio

from ground.errors import NotFound, ResourceExhausted
from ground.streaming import error_response, serve_stream
from ground.wire import REASON, RETRY_AFTER, STATUS
from protos import grpc_service_pb2 as pb


class FakeCall:
    def __init__(self, requests) -> None:
        self.incoming: asyncio.Queue = asyncio.Queue()
        for r in requests:
            self.incoming.put_nowait(r)
        self.reads = 0
        self.written: list = []

    def end(self) -> None:
        self.incoming.put_nowait(aio.EOF)

    async def read(self):
        r = await self.incoming.get()
        if r is not aio.EOF:
            self.reads += 1
        return r

    async def write(self, msg) -> None:
        self.written.append(msg)


def _run(coro):
    return asyncio.run(coro)


def test_each_request_is_answered_as_it_completes_and_failures_are_answers():
    async def main():
        call = FakeCall(["slow", "fast", "bad"])
        call.end()
        release = asyncio.Event()

        async def answer(r):
            if r == "slow":
                await release.wait()
            if r == "bad":
                raise NotFound("no")
            if r == "fast":
                release.set()
            return f"ok:{r}"

        await serve_stream(call, answer, lambda r, e: f"err:{r}:{type(e).__name__}")
        return call.written

    written = _run(main())
    assert written.index("ok:fast") < written.index("ok:slow")
    assert sorted(written) == ["err:bad:NotFound", "ok:fast", "ok:slow"]


def test_the_stream_is_not_read_past_the_in_flight_bound():
    async def main():
        call = FakeCall(range(10))
        gate = asyncio.Event()

        async def answer(r):
            await gate.wait()
            return r

        task = asyncio.create_task(serve_stream(call, answer, lambda r, e: None, max_inflight=3))
        for _ in range(20):
            await asyncio.sleep(0)  # let the loop run; it blocks on the bound, not on time
        reads_at_bound = call.reads
        call.end()
        gate.set()
        await task
        return reads_at_bound, call.written

    reads_at_bound, written = _run(main())
    assert reads_at_bound == 3
    assert sorted(written) == list(range(10))


def test_ending_the_call_cancels_requests_in_flight_and_writes_nothing_after():
    async def main():
        call = FakeCall(["a", "b"])
        cancelled = []
        never = asyncio.Event()

        async def answer(r):
            try:
                await never.wait()
            except asyncio.CancelledError:
                cancelled.append(r)
                raise
            return r

        task = asyncio.create_task(serve_stream(call, answer, lambda r, e: "err"))
        for _ in range(10):
            await asyncio.sleep(0)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        written_at_end = list(call.written)
        never.set()
        for _ in range(10):
            await asyncio.sleep(0)
        return sorted(cancelled), written_at_end, call.written

    cancelled, at_end, later = _run(main())
    assert cancelled == ["a", "b"]
    assert at_end == [] and later == []


def test_an_error_answer_carries_the_status_contract_as_parameters():
    r = error_response(ResourceExhausted("full", retry_after_ms=250, reason="inflight_bytes"), "m", "1", "id7")
    assert r.error_message == "full"
    ir = r.infer_response
    assert (ir.model_name, ir.model_version, ir.id) == ("m", "1", "id7")
    assert ir.parameters[STATUS].string_param == grpc.StatusCode.RESOURCE_EXHAUSTED.name
    assert ir.parameters[REASON].string_param == "inflight_bytes"
    assert ir.parameters[RETRY_AFTER].int64_param == 250
    internal = error_response(RuntimeError("/secret/path boom"))
    assert "secret" not in internal.error_message and internal.infer_response.parameters[STATUS].string_param == "INTERNAL"
    assert isinstance(r, pb.ModelStreamInferResponse)


def test_a_message_that_cannot_be_decoded_is_answered_and_the_stream_goes_on():
    from google.protobuf.message import DecodeError

    class Garbled(FakeCall):
        async def read(self):
            r = await super().read()
            if r == "garbage":
                raise DecodeError("corrupt")
            return r

    async def main():
        call = Garbled(["a", "garbage", "b"])
        call.end()

        async def answer(r):
            return f"ok:{r}"

        await serve_stream(call, answer, lambda r, e: f"err:{r}:{e.code.name}")
        return call.written

    assert sorted(_run(main())) == ["err:None:INVALID_ARGUMENT", "ok:a", "ok:b"]


def test_a_failed_write_stops_reading_and_ends_the_call():
    class Broken(FakeCall):
        aborted = None

        async def write(self, msg) -> None:
            raise RuntimeError("send failed")

        def set_trailing_metadata(self, md) -> None:
            pass

        def done(self) -> bool:
            return False

        async def abort(self, code, text):
            self.aborted = code
            raise aio.AbortError()

    async def main():
        call = Broken(["a", "b", "c"])
        gate = asyncio.Event()

        async def answer(r):
            if r != "a":
                await gate.wait()
            return r

        task = asyncio.create_task(serve_stream(call, answer, lambda r, e: "err", max_inflight=2))
        for _ in range(20):
            await asyncio.sleep(0)
        call.end()
        gate.set()
        try:
            await task
        except aio.AbortError:
            pass
        return call

    call = _run(main())
    assert call.aborted is grpc.StatusCode.INTERNAL
    assert call.reads == 2  # "c" was never read: the stream was over
