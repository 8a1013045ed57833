"""router/host_streams.py against a real hostd process, through the router's Forwarder: ModelInfer calls go many
to a stream and come back as unary calls would (the same answer, mmhost-served for the access log); a host
that hangs fails a call at its deadline; a host killed with calls out fails each as a transport failure, which
router/failover.py reads as a host that is down (so the dispatcher retries elsewhere); big bodies go unary.
Each behaviour is checked on both carriers of a stream: a gRPC stream (HostdData.Infer) and the host's data
link (plain TCP, ground/framelink.py), which routers use when the host advertises a data port."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from ground.wire import SERVED, TENANT_HEADER
from mmhost.demo_models import build_onnx_mlp, onnx_manifest
from protos import grpc_service_pb2 as pb
from protos import grpc_service_pb2_grpc as pb_grpc
from router.failover import Outcome, classify
from router import host_streams
from router.forward import Forwarder
from router.host_client import HostError
from catalog.publish import publish_version
from catalog.repository import ModelRepository
from storage_adapters.local import LocalStorage
from tests.hostd_proc import HostdProc
from tests.servers import free_port

DIM = 64
ROOT = Path(__file__).resolve().parents[2]
MD = ((TENANT_HEADER, "demo"),)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """The two models these tests call (the demo store's torch models would add ~1.4 s to each preloading hostd)."""
    root = tmp_path_factory.mktemp("store")
    work = tmp_path_factory.mktemp("models")
    build_onnx_mlp(work / "mlp.onnx", (DIM, 128, 10))
    build_onnx_mlp(work / "big.onnx", (DIM, 2048, 2048, 10))  # ~1 ms a pass: calls are out when the host dies
    repo = ModelRepository(LocalStorage(root))
    for name, f in (("mlp", "mlp.onnx"), ("mlp_big", "big.onnx")):
        publish_version(repo, onnx_manifest("demo", name, "1", work / f, "model.onnx"), {"model.onnx": work / f})
    return root


@pytest.fixture(params=["grpc", "link"])
def host(request, store, tmp_path):
    h = HostdProc(str(store), tmp_path, args=["--preload"])
    h.transport = request.param
    yield h
    if h.proc.poll() is None:
        os.kill(h.proc.pid, signal.SIGCONT)
        h.stop()


def _body(model: str = "mlp", seed: int = 0) -> bytes:
    x = np.random.default_rng(seed).random((1, DIM), dtype=np.float32)
    return pb.ModelInferRequest(model_name=model, raw_input_contents=[x.tobytes()], inputs=[
        pb.ModelInferRequest.InferInputTensor(name="input", datatype="FP32", shape=[1, DIM])]).SerializeToString()


def _wait_ready(addr: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    with grpc.insecure_channel(addr) as ch:
        stub = pb_grpc.GRPCInferenceServiceStub(ch)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if stub.ModelReady(pb.ModelReadyRequest(name="mlp"), timeout=2).ready:
                    return
            except grpc.RpcError:
                time.sleep(0.2)
    raise TimeoutError(f"plain server on {addr} not ready")


def _out(resp: bytes) -> np.ndarray:
    return np.frombuffer(pb.ModelInferResponse.FromString(resp).raw_output_contents[0], np.float32)


def _run(coro):
    return asyncio.run(coro)


def _fwd(host, *args, **kw) -> Forwarder:
    """A Forwarder whose streams to `host` go on its data link when the test's transport is "link" (as a
    router's refresh sets them from the host's status), else on gRPC streams."""
    f = Forwarder(*args, **kw)
    if getattr(host, "transport", "grpc") == "link":
        port = host.status().data_port
        assert port > 0, "a plaintext hostd advertises its data port"
        f.set_data_ports({host.addr: port})
    return f


def _links(f: Forwarder) -> int:
    return sum(st.link for p in f._streams._pools.values() for st in p.streams)


def test_calls_on_streams_answer_as_unary_calls_do(host):
    async def go():
        streamed, unary = _fwd(host, 64 << 20, streams=2, stream_max_body_bytes=1 << 20), Forwarder(64 << 20)
        try:
            trailers: list = []
            got = await asyncio.gather(*(streamed.unary(host.addr, "ModelInfer", _body(seed=i), timeout=30,
                                                        metadata=MD, trailers=trailers) for i in range(8)))
            want = [await unary.unary(host.addr, "ModelInfer", _body(seed=i), timeout=30, metadata=MD)
                    for i in range(8)]
            assert streamed._streams.open_streams(host.addr) == 2  # the calls went on streams: 8 out, GROW_AT 4
            assert _links(streamed) == (2 if host.transport == "link" else 0)
            return got, want, trailers
        finally:
            await streamed.close()
            await unary.close()

    got, want, trailers = _run(go())
    for g, w in zip(got, want, strict=True):  # concurrent calls may share a batch: the same up to rounding
        np.testing.assert_allclose(_out(g), _out(w), rtol=1e-4, atol=1e-5)
    assert [k for k, _ in trailers].count(SERVED) == 8


def test_a_missing_model_fails_as_on_a_unary_call(host):
    async def go():
        f = _fwd(host, 64 << 20, streams=1, stream_max_body_bytes=1 << 20)
        try:
            with pytest.raises(HostError) as e:
                await f.unary(host.addr, "ModelInfer", _body("nope"), timeout=30, metadata=MD)
            return e.value
        finally:
            await f.close()

    err = _run(go())
    assert err.code == grpc.StatusCode.NOT_FOUND and err.reason and classify(err.code, err.trailing) is Outcome.FINAL


def test_a_hung_host_fails_the_call_at_its_deadline_and_serves_after(host):
    async def go():
        f = _fwd(host, 64 << 20, streams=1, stream_max_body_bytes=1 << 20)
        try:
            await f.unary(host.addr, "ModelInfer", _body(), timeout=30, metadata=MD)  # the stream is open
            os.kill(host.proc.pid, signal.SIGSTOP)
            t0 = time.monotonic()
            try:
                with pytest.raises(HostError) as e:  # wait_for: a call that never fails must fail the test, not hang it
                    await asyncio.wait_for(f.unary(host.addr, "ModelInfer", _body(), timeout=0.5, metadata=MD), 10)
                waited = time.monotonic() - t0
            finally:
                os.kill(host.proc.pid, signal.SIGCONT)
            after = await f.unary(host.addr, "ModelInfer", _body(), timeout=30, metadata=MD)
            return e.value, waited, after
        finally:
            await f.close()

    err, waited, after = _run(go())
    assert err.code == grpc.StatusCode.DEADLINE_EXCEEDED and 0.5 <= waited < 5
    assert pb.ModelInferResponse.FromString(after).outputs[0].name == "output"


def test_a_host_killed_with_calls_out_fails_each_as_a_host_that_is_down(host):
    ends: list[str] = []  # what the router's mmhost_router_hostd_stream_ends_total counts

    async def go():
        f = _fwd(host, 64 << 20, streams=2, stream_max_body_bytes=1 << 20, on_stream_end=ends.append)
        try:
            await asyncio.gather(*(f.unary(host.addr, "ModelInfer", _body(), timeout=30, metadata=MD) for _ in range(4)))
            os.kill(host.proc.pid, signal.SIGSTOP)  # so that every call below is out when it dies
            calls = [asyncio.ensure_future(f.unary(host.addr, "ModelInfer", _body("mlp_big", i), timeout=None,
                                                   metadata=MD)) for i in range(64)]
            await asyncio.sleep(0.2)
            host.proc.kill()
            done = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 20)  # none hangs
            late = await asyncio.gather(f.unary(host.addr, "ModelInfer", _body(), timeout=5, metadata=MD),
                                        return_exceptions=True)
            return done, late[0]
        finally:
            await f.close()

    done, late = _run(go())
    assert all(isinstance(d, BaseException) for d in done), "the host died with every call out"
    for e in done:
        assert isinstance(e, HostError) and classify(e.code, e.trailing) is Outcome.HOST_DOWN, e
    assert isinstance(late, HostError) and classify(late.code, late.trailing) is Outcome.HOST_DOWN
    # on a link, the late call's new connection is refused: it went on a gRPC stream, which failed as well
    assert ends and set(ends) == ({"broken", "link_unreachable"} if host.transport == "link" else {"broken"})


def test_a_body_over_the_stream_limit_goes_as_a_unary_call(host):
    async def go():
        f = _fwd(host, 64 << 20, streams=2, stream_max_body_bytes=100)
        try:
            resp = await f.unary(host.addr, "ModelInfer", _body(), timeout=30, metadata=MD)
            return resp, f._streams.open_streams()
        finally:
            await f.close()

    resp, streams = _run(go())
    assert pb.ModelInferResponse.FromString(resp).outputs and streams == 0


def test_each_model_has_streams_of_its_own_and_an_idle_models_close(host):
    """A stream's frames and answers go one after another: one model's backlog must not sit in front of
    another's calls. A model idle for IDLE_S has its streams closed at the next sweep."""
    now = [0.0]

    async def go():
        f = _fwd(host, 64 << 20, streams=4, stream_max_body_bytes=1 << 20)
        f._streams._clock = lambda: now[0]
        try:
            await asyncio.gather(*(f.unary(host.addr, "ModelInfer", _body("mlp_big", i), timeout=30, metadata=MD,
                                           lane="demo/mlp_big") for i in range(16)),
                                 f.unary(host.addr, "ModelInfer", _body(), timeout=30, metadata=MD, lane="demo/mlp"))
            big = f._streams._pools[host.addr, "demo/mlp_big"].streams
            small = f._streams._pools[host.addr, "demo/mlp"].streams
            assert len(big) == 4 and len(small) == 1 and not set(big) & set(small)
            now[0] = host_streams.IDLE_S / 2
            await f.unary(host.addr, "ModelInfer", _body(), timeout=30, metadata=MD, lane="demo/mlp")
            now[0] = host_streams.IDLE_S + 1
            closed = f._streams.sweep()
            left = f._streams.open_streams()
            again = await f.unary(host.addr, "ModelInfer", _body("mlp_big"), timeout=30, metadata=MD,
                                  lane="demo/mlp_big")
            return closed, left, again
        finally:
            await f.close()

    closed, left, again = _run(go())
    assert (closed, left) == (4, 1)  # mlp_big's four went; mlp, used since, kept its one
    assert pb.ModelInferResponse.FromString(again).outputs


def test_a_draining_host_answers_the_calls_out_and_refuses_new_ones_for_another_host(host):
    """SIGTERM with calls out on the streams: each is answered, or refused as a host that is leaving (the
    dispatcher retries it elsewhere); none gets a status the caller would see."""
    async def go():
        f = _fwd(host, 64 << 20, streams=2, stream_max_body_bytes=1 << 20)
        try:
            await f.unary(host.addr, "ModelInfer", _body("mlp_big"), timeout=30, metadata=MD)
            calls = [asyncio.ensure_future(f.unary(host.addr, "ModelInfer", _body("mlp_big", i), timeout=30,
                                                   metadata=MD)) for i in range(256)]
            await asyncio.sleep(0.01)
            host.proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.3)  # draining: new calls are refused
            calls += [asyncio.ensure_future(f.unary(host.addr, "ModelInfer", _body(), timeout=30, metadata=MD))
                      for _ in range(8)]
            return await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 60)
        finally:
            await f.close()

    done = _run(go())
    answered = [d for d in done if isinstance(d, bytes)]
    refused = [d for d in done if not isinstance(d, bytes)]
    assert answered and refused
    for e in refused:
        assert isinstance(e, HostError) and classify(e.code, e.trailing) is Outcome.HOST_DOWN, e


def test_a_host_without_hostd_data_is_called_unary_during_a_rolling_upgrade(tmp_path):
    """A server with v2 ModelInfer but no HostdData service (a hostd older than the router; here
    bench/plain_server.py, a real process): the stream ends UNIMPLEMENTED, the call is made again as a unary
    call and answered, the host is not marked down, and the next calls go unary without trying a stream."""
    build_onnx_mlp(tmp_path / "m.onnx", (DIM, 32, 8))
    addr = f"127.0.0.1:{free_port()}"
    proc = subprocess.Popen([sys.executable, "-m", "bench.plain_server", addr, str(tmp_path / "m.onnx"), "mlp"],
                            cwd=ROOT, stdout=open(tmp_path / "plain.log", "wb"), stderr=subprocess.STDOUT)
    _wait_ready(addr, proc)

    ends: list[str] = []

    async def go():
        f = Forwarder(64 << 20, streams=2, stream_max_body_bytes=1 << 20, on_stream_end=ends.append)
        try:
            first = await f.unary(addr, "ModelInfer", _body(), timeout=30, metadata=MD, lane="demo/mlp")
            opened = f._streams.open_streams()
            second = await f.unary(addr, "ModelInfer", _body(), timeout=30, metadata=MD, lane="demo/mlp")
            return first, second, opened, f._streams.open_streams(), f._streams.takes(addr, b"x")
        finally:
            await f.close()

    try:
        first, second, opened, after, takes = _run(go())
    finally:
        proc.terminate()
        proc.wait(30)
    assert pb.ModelInferResponse.FromString(first).outputs and pb.ModelInferResponse.FromString(second).outputs
    assert (opened, after, takes) == (0, 0, False) and ends == ["unsupported"]


@pytest.mark.parametrize("transport", ["grpc", "link"])
def test_messages_stay_under_the_hosts_message_limit_when_many_calls_queue(store, tmp_path, transport):
    """40 calls of 200 KB queued on one stream hold 8 MB, four times what this hostd takes in one message
    (max_request_bytes 1 MiB + 1 MiB): the router's messages stop taking frames at ground.forwarded.BATCH_BYTES,
    so each call gets its own answer from the host (here INVALID_ARGUMENT: the tensor is not the model's
    shape), and the stream never breaks."""
    h = HostdProc(str(store), tmp_path, args=["--preload"], env={"MMHOST_HOSTD_MAX_REQUEST_BYTES": str(1 << 20)})
    h.transport = transport
    ends: list[str] = []
    x = np.ones((1, 50_000), dtype=np.float32)
    big = pb.ModelInferRequest(model_name="mlp", raw_input_contents=[x.tobytes()], inputs=[
        pb.ModelInferRequest.InferInputTensor(name="input", datatype="FP32", shape=[1, 50_000])]).SerializeToString()

    async def go():
        f = _fwd(h, 64 << 20, streams=1, stream_max_body_bytes=256 << 10, on_stream_end=ends.append)
        try:
            return await asyncio.gather(*(f.unary(h.addr, "ModelInfer", big, timeout=30, metadata=MD)
                                          for _ in range(40)), return_exceptions=True)
        finally:
            await f.close()

    try:
        done = _run(go())
    finally:
        h.stop()
    assert len(big) > 190_000 and not ends
    for e in done:
        assert isinstance(e, HostError) and e.code == grpc.StatusCode.INVALID_ARGUMENT and e.reason, e


def test_take_fills_a_message_up_to_the_limit_and_leaves_the_rest():
    from ground.forwarded import take

    q = [b"a" * 400, b"b" * 400, b"c" * 400, b"d" * 10]
    assert take(q, 1000) == [b"a" * 400, b"b" * 400, b"c" * 400] and q == [b"d" * 10]
    assert take(q, 1000) == [b"d" * 10] and q == []
    q = [b"x" * 5000, b"y"]
    assert take(q, 1000) == [b"x" * 5000] and q == [b"y"]  # one frame over the limit goes alone


def _tile_model(path: Path, repeats: int) -> None:
    """input [N, 64] -> output [N, 64 * repeats]: a small model whose answer is large."""
    import onnx
    from onnx import TensorProto, helper

    reps = helper.make_tensor("reps", TensorProto.INT64, [2], [1, repeats])
    graph = helper.make_graph([helper.make_node("Tile", ["input", "reps"], ["output"])], "tile",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", DIM])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", DIM * repeats])],
                              initializer=[reps])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


@pytest.mark.parametrize("transport", ["grpc", "link"])
def test_an_answer_over_a_message_limit_fails_its_calls_final_and_the_host_stays_up(tmp_path, transport):
    """A model whose answer (1.3 MB) is over hostd's send limit (max_request_bytes 64 KiB + 1 MiB): hostd answers
    that call RESOURCE_EXHAUSTED by itself and the stream goes on. Over the router's own max_message_bytes
    (here 4 KiB, hostd's limit not reached): the stream ends on the router's side and its calls fail
    RESOURCE_EXHAUSTED, final as a unary call's would be, never as a host that is down."""
    root = tmp_path / "store"
    _tile_model(tmp_path / "tile.onnx", 5000)
    _tile_model(tmp_path / "tile_small.onnx", 20)
    repo = ModelRepository(LocalStorage(root))
    for name, f in (("tile", "tile.onnx"), ("tile_small", "tile_small.onnx")):
        publish_version(repo, onnx_manifest("demo", name, "1", tmp_path / f, "model.onnx"), {"model.onnx": tmp_path / f})
    h = HostdProc(str(root), tmp_path, env={"MMHOST_HOSTD_MAX_REQUEST_BYTES": str(64 << 10)})
    h.transport = transport

    async def go():
        at_host = _fwd(h, 64 << 20, streams=1, stream_max_body_bytes=1 << 20)
        at_router = _fwd(h, 4096, streams=1, stream_max_body_bytes=1 << 20)
        try:
            big = await asyncio.gather(at_host.unary(h.addr, "ModelInfer", _body("tile"), timeout=60, metadata=MD),
                                       return_exceptions=True)
            after = await at_host.unary(h.addr, "ModelInfer", _body("tile_small"), timeout=60, metadata=MD)
            small_but_over = await asyncio.gather(at_router.unary(h.addr, "ModelInfer", _body("tile_small", 1),
                                                                  timeout=60, metadata=MD), return_exceptions=True)
            return big[0], after, small_but_over[0], at_host._streams.open_streams()
        finally:
            await at_host.close()
            await at_router.close()

    try:
        big, after, over, streams = _run(go())
    finally:
        h.stop()
    assert isinstance(big, HostError) and big.code == grpc.StatusCode.RESOURCE_EXHAUSTED and big.reason, big
    assert pb.ModelInferResponse.FromString(after).outputs and streams == 1  # the same stream went on
    assert isinstance(over, HostError) and over.code == grpc.StatusCode.RESOURCE_EXHAUSTED, over
    assert classify(over.code, over.trailing) is Outcome.FINAL


def test_a_data_link_that_cannot_be_reached_sends_the_calls_on_grpc_streams(store, tmp_path):
    """A host whose advertised data port takes no connections (closed here; a firewall in real life): the
    call is answered on a gRPC stream, the host is not marked down, the next calls do not try the link
    again, and the stream end is counted as link_unreachable once."""
    h = HostdProc(str(store), tmp_path, args=["--preload"])
    ends: list[str] = []

    async def go():
        f = Forwarder(64 << 20, streams=1, stream_max_body_bytes=1 << 20, on_stream_end=ends.append)
        f.set_data_ports({h.addr: free_port()})  # nothing listens there
        try:
            first = await f.unary(h.addr, "ModelInfer", _body(), timeout=30, metadata=MD, lane="demo/mlp")
            second = await f.unary(h.addr, "ModelInfer", _body(), timeout=30, metadata=MD, lane="demo/mlp")
            return first, second, f._streams.open_streams(), _links(f)
        finally:
            await f.close()

    try:
        first, second, streams, links = _run(go())
    finally:
        h.stop()
    assert pb.ModelInferResponse.FromString(first).outputs and pb.ModelInferResponse.FromString(second).outputs
    assert (streams, links) == (1, 0) and ends == ["link_unreachable"]


def test_the_data_port_closes_what_is_not_a_router_link_and_serves_on(store, tmp_path):
    """Bytes that are not the link's (no MAGIC), or a message longer than the host takes: hostd closes that
    connection and keeps answering the others."""
    import socket

    from ground.framelink import MAGIC

    h = HostdProc(str(store), tmp_path, args=["--preload"], env={"MMHOST_HOSTD_MAX_REQUEST_BYTES": str(1 << 20)})
    h.transport = "link"
    try:
        port = h.status().data_port
        for junk in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", MAGIC + (64 << 20).to_bytes(4, "little")):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(junk)
                assert s.recv(100) == b""  # closed by the host, nothing answered

        async def go():
            f = _fwd(h, 64 << 20, streams=1, stream_max_body_bytes=1 << 20)
            try:
                return await f.unary(h.addr, "ModelInfer", _body(), timeout=30, metadata=MD), _links(f)
            finally:
                await f.close()

        resp, links = _run(go())
        assert pb.ModelInferResponse.FromString(resp).outputs and links == 1
    finally:
        h.stop()


def test_a_hostd_with_its_data_port_off_advertises_none(store, tmp_path):
    h = HostdProc(str(store), tmp_path, env={"MMHOST_HOSTD_DATA_PORT": "-1"})
    try:
        assert h.status().data_port == 0
    finally:
        h.stop()
