"""The tiered cache on a real hostd whose device budget fits only a few of ~20 registered models."""

from __future__ import annotations

import asyncio
import json
import threading

import grpc
import numpy as np
import onnxruntime as ort
import psutil
import pytest

from mmhost.demo_models import build_onnx_mlp, onnx_manifest
from protos import grpc_service_pb2 as pb
from protos import grpc_service_pb2_grpc
from storage_adapters.local import LocalStorage
from catalog.publish import publish_version
from catalog.repository import ModelRepository
from tests.hostd_proc import HostdProc, metric_value

N = 20
DIMS = (64, 768, 768, 10)  # ~2.6 MB each
BUDGET = "32MB"  # about 10 of the 20 small models (each measures ~2.7-5 MB on CPU), or "big" and a few small ones


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("cache-store")
    work = tmp_path_factory.mktemp("cache-models")
    repo = ModelRepository(LocalStorage(root))
    for i in range(N):
        build_onnx_mlp(work / f"m{i}.onnx", DIMS, seed=i)
        publish_version(repo, onnx_manifest("demo", f"m{i}", "1", work / f"m{i}.onnx", "model.onnx"), {"model.onnx": work / f"m{i}.onnx"})
    build_onnx_mlp(work / "other.onnx", DIMS, seed=99)
    publish_version(repo, onnx_manifest("other", "o0", "1", work / "other.onnx", "model.onnx"), {"model.onnx": work / "other.onnx"})
    build_onnx_mlp(work / "big.onnx", (64, 2048, 2048, 10), seed=7)
    publish_version(repo, onnx_manifest("demo", "big", "1", work / "big.onnx", "model.onnx"), {"model.onnx": work / "big.onnx"})
    build_onnx_mlp(work / "huge.onnx", (64, 4096, 2048, 10), seed=8)  # ~34 MB: more than the whole budget
    publish_version(repo, onnx_manifest("demo", "huge", "1", work / "huge.onnx", "model.onnx"), {"model.onnx": work / "huge.onnx"})
    # a corrupt version: the manifest's sha256 does not match the stored bytes
    build_onnx_mlp(work / "bad.onnx", DIMS, seed=5)
    m = publish_version(repo, onnx_manifest("demo", "corrupt", "1", work / "bad.onnx", "model.onnx"), {"model.onnx": work / "bad.onnx"})
    p = root / "tenants/demo/models/corrupt/1/model.onnx"
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0xFF
    p.write_bytes(bytes(data))
    assert m.files[0].size == len(data)
    return root, work


def _req(model: str, x: np.ndarray) -> pb.ModelInferRequest:
    r = pb.ModelInferRequest(model_name=model)
    r.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
    r.raw_input_contents.append(x.tobytes())
    return r


def _out(resp) -> np.ndarray:
    return np.frombuffer(resp.raw_output_contents[0], np.float32).reshape(list(resp.outputs[0].shape))


def _ref(work, name: str, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(str(work / f"{name}.onnx"), providers=["CPUExecutionProvider"])
    return sess.run(["output"], {"input": x})[0]


def _loads(h: HostdProc, model: str, result: str = "success", tenant: str = "demo") -> float:
    return metric_value(h.metrics_text(), "mmhost_model_loads_total", model=model, result=result, tenant=tenant)


@pytest.fixture(scope="module")
def hostd(store, tmp_path_factory):
    root, _ = store
    shares = json.dumps({"other": {"guaranteed": "35%"}})
    h = HostdProc(str(root), tmp_path_factory.mktemp("cache-hostd"),
                  args=["--device-memory", BUDGET, "--tenant-shares", shares, "--ram-cache", "64MB"],
                  env={"MMHOST_HOSTD_FAILED_BACKOFF_S": "0.3"})
    yield h
    h.stop()


def _resident(h: HostdProc) -> dict[tuple[str, str], int]:
    return {(m.tenant, m.model): m.memory_bytes for m in h.status().models if m.state == "READY"}


def test_round_robin_over_more_models_than_fit(hostd, store):
    _, work = store
    x = np.random.default_rng(0).random((2, 64), dtype=np.float32)
    for _ in range(2):
        for i in range(N):
            np.testing.assert_allclose(_out(hostd.stub.ModelInfer(_req(f"m{i}", x))), _ref(work, f"m{i}", x), rtol=1e-5, atol=1e-5)
            st = hostd.status()
            assert st.device_memory_used <= st.device_memory_budget
    text = hostd.metrics_text()
    resident = _resident(hostd)
    assert 1 <= len(resident) < N  # only some fit
    assert all(size > 0 for size in resident.values())  # measured, not zero
    assert sum(resident.values()) <= 32_000_000
    loads = metric_value(text, "mmhost_model_loads_total", result="success")
    evictions = metric_value(text, "mmhost_cache_evictions_total", tier="device")
    assert loads >= 2 * N - len(resident)  # models evicted in round one were loaded again in round two
    assert evictions == loads - len(resident)  # every load stayed resident or was evicted, nothing leaked
    assert metric_value(text, "mmhost_cache_hits_total", tier="ram") >= N - len(resident)  # reloads from RAM
    assert metric_value(text, "mmhost_cache_misses_total", tier="disk") >= N  # round one came from storage


async def _burst(addr: str, model: str, n: int, x: np.ndarray):
    async with grpc.aio.insecure_channel(addr) as ch:
        stub = grpc_service_pb2_grpc.GRPCInferenceServiceStub(ch)
        return await asyncio.gather(*(stub.ModelInfer(_req(model, x)) for _ in range(n)))


def test_concurrent_first_requests_trigger_exactly_one_load(hostd, store):
    _, work = store
    hostd.stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name="m7"))
    before = _loads(hostd, "m7")
    x = np.ones((1, 64), np.float32)
    resps = asyncio.run(_burst(hostd.addr, "m7", 24, x))
    for r in resps:
        np.testing.assert_allclose(_out(r), _ref(work, "m7", x), rtol=1e-5, atol=1e-5)
    assert _loads(hostd, "m7") - before == 1


def test_pinned_model_survives(hostd):
    load = pb.RepositoryModelLoadRequest(model_name="m3")
    load.parameters["pin"].bool_param = True
    hostd.stub.RepositoryModelLoad(load)
    before = _loads(hostd, "m3")
    x = np.ones((1, 64), np.float32)
    for i in range(N):
        if i != 3:
            hostd.stub.ModelInfer(_req(f"m{i}", x))
    assert ("demo", "m3") in _resident(hostd)
    assert _loads(hostd, "m3") == before
    hostd.stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name="m3"))  # unpins


def test_tenant_over_its_share_is_evicted_first(hostd):
    x = np.ones((1, 64), np.float32)
    other = (("mmhost-tenant", "other"),)
    hostd.stub.ModelInfer(_req("o0", x), metadata=other)
    before = _loads(hostd, "o0", tenant="other")
    for i in range(N):  # "demo" is over its (zero) guarantee: its own models make room for each other
        hostd.stub.ModelInfer(_req(f"m{i}", x))
    assert ("other", "o0") in _resident(hostd)
    assert _loads(hostd, "o0", tenant="other") == before


def test_model_with_work_in_flight_is_not_evicted(hostd):
    big_x = np.ones((32, 64), np.float32)
    x = np.ones((1, 64), np.float32)
    hostd.stub.ModelInfer(_req("big", x))
    before = _loads(hostd, "big")
    errors: list[Exception] = []

    stop = threading.Event()

    async def workers(n: int) -> None:
        # a closed loop of 8 callers until the loads are done: each batch is one 32-row request, so 7 wait in
        # the queue while one runs, and the model is never idle unless the client stalls for 7 batches (a
        # one-shot burst of 48 once drained on a loaded machine before its last requests arrived: an idle gap
        # in which evicting "big" was right, and the reload the assertion counted)
        async with grpc.aio.insecure_channel(hostd.addr) as ch:
            stub = grpc_service_pb2_grpc.GRPCInferenceServiceStub(ch)

            async def one() -> None:
                while not stop.is_set():
                    await stub.ModelInfer(_req("big", big_x))

            await asyncio.gather(*(one() for _ in range(n)))

    def keep_busy():
        try:
            asyncio.run(workers(8))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    t = threading.Thread(target=keep_busy)
    t.start()
    seen_busy = False
    for i in range(6):  # loads while "big" (the least recently used) has work queued or running
        for m in hostd.status().models:
            if m.model == "big" and (m.queue_depth or m.in_flight):
                seen_busy = True
        try:
            hostd.stub.ModelInfer(_req(f"m{i}", x))
        except grpc.RpcError as e:  # no room right now is an honest answer; evicting busy work is not
            assert e.code() == grpc.StatusCode.UNAVAILABLE and "no device memory" in e.details()
    stop.set()
    t.join(60)
    assert not errors, errors
    assert seen_busy
    assert _loads(hostd, "big") == before


def test_failed_load_backs_off_then_retries(hostd):
    x = np.ones((1, 64), np.float32)
    with pytest.raises(grpc.RpcError) as ei:
        hostd.stub.ModelInfer(_req("corrupt", x))
    assert ei.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "'corrupt'" in ei.value.details() and "'1'" in ei.value.details() and "model.onnx" in ei.value.details()
    assert "sha256" in ei.value.details()
    with pytest.raises(grpc.RpcError) as ei:  # within the backoff: refused at once, no second attempt
        hostd.stub.ModelInfer(_req("corrupt", x))
    assert "next attempt in" in ei.value.details()
    assert int(dict(ei.value.trailing_metadata())["retry-after-ms"]) > 0
    assert _loads(hostd, "corrupt", "failure") == 1
    idx = {m.name: m for m in hostd.stub.RepositoryIndex(pb.RepositoryIndexRequest()).models}
    assert idx["corrupt"].state == "UNAVAILABLE" and "sha256" in idx["corrupt"].reason
    for _ in range(100):  # after the backoff the next request tries again
        try:
            hostd.stub.ModelInfer(_req("corrupt", x))
        except grpc.RpcError:
            pass
        if _loads(hostd, "corrupt", "failure") >= 2:
            break
        threading.Event().wait(0.05)
    assert _loads(hostd, "corrupt", "failure") >= 2
    assert hostd.stub.ModelInfer(_req("m0", x)).outputs  # everyone else is served


def test_load_unload_cycles_do_not_leak(hostd):
    proc = psutil.Process(hostd.proc.pid)
    load = pb.RepositoryModelLoadRequest(model_name="m11")
    unload = pb.RepositoryModelUnloadRequest(model_name="m11")

    def cycle(n: int) -> None:
        for _ in range(n):
            hostd.stub.RepositoryModelLoad(load)
            hostd.stub.RepositoryModelUnload(unload)

    cycle(20)
    base = proc.memory_info().rss
    cycle(200)
    grown = proc.memory_info().rss - base
    assert grown < 40 * 1024 * 1024, f"RSS grew {grown / 1e6:.1f} MB over 200 load/unload cycles"


def test_no_room_is_refused_without_marking_the_model_failed(hostd):
    x = np.ones((1, 64), np.float32)
    for _ in range(2):  # refused the same way twice: no FAILED backoff for a model that is merely too big now
        with pytest.raises(grpc.RpcError) as ei:
            hostd.stub.ModelInfer(_req("huge", x))
        assert ei.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "no device memory" in ei.value.details() and "next attempt" not in ei.value.details()
        assert int(dict(ei.value.trailing_metadata())["retry-after-ms"]) > 0
    states = {m.model: m.state for m in hostd.status().models}
    assert states["huge"] == "ABSENT"
    assert _loads(hostd, "huge", "failure") == 0
    assert metric_value(hostd.metrics_text(), "mmhost_requests_shed_total", model="huge", reason="no_capacity") == 2
