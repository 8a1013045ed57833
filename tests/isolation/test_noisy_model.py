"""A light model beside a saturating noisy model of the SAME tenant, on a real hostd with 2 execution slots
and the noisy model run by 3 instances (so it could hold every slot): the light model's requests never
wait behind a noisy batch. Asserted from hostd's own accounting, not from wall-clock thresholds: the light
model's mean queue time (ModelStatistics: from arrival to the start of its batch) is under half of one noisy
batch's mean compute time, measured over the same seconds. Before the kept slot and the per-model fairness,
a light request waited for a running noisy batch to end and then, often, for the noisy model's next batch,
which had asked first: about one batch on average (2.2 ms against 1.97 ms batches), and this test failed."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import grpc
import numpy as np
import pytest

from catalog.publish import publish_version
from catalog.repository import ModelRepository
from mmhost.demo_models import build_onnx_mlp, onnx_manifest
from protos import grpc_service_pb2 as pb
from protos import grpc_service_pb2_grpc
from storage_adapters.local import LocalStorage
from tests.hostd_proc import HostdProc

NOISY_DIMS = (64, 2048, 2048, 10)
LIGHT_DIMS = (16, 32, 4)


def _request(model: str, dims: tuple[int, ...]) -> pb.ModelInferRequest:
    x = np.random.default_rng(0).random((1, dims[0]), dtype=np.float32)
    return pb.ModelInferRequest(model_name=model, inputs=[pb.ModelInferRequest.InferInputTensor(
        name="input", datatype="FP32", shape=[1, dims[0]])], raw_input_contents=[x.tobytes()])


@pytest.fixture(scope="module")
def hostd(tmp_path_factory):
    work = tmp_path_factory.mktemp("noisy_model")
    store = work / "store"
    repo = ModelRepository(LocalStorage(store))
    for name, dims in (("noisy", NOISY_DIMS), ("light", LIGHT_DIMS)):
        build_onnx_mlp(work / f"{name}.onnx", dims)
        publish_version(repo, onnx_manifest("acme", name, "1", work / f"{name}.onnx", "model.onnx"),
                        {"model.onnx": work / f"{name}.onnx"})
    limits = work / "limits.json"
    limits.write_text(json.dumps({"acme": {"tier": "unlimited", "instances": 3}}))
    h = HostdProc(str(store), work, tenant="acme", args=["--tenant-limits", str(limits)],
                  env={"MMHOST_HOSTD_EXECUTION_SLOTS": "2"})
    yield h
    h.stop()


def _noisy_load(addr: str, stop: threading.Event, errors: list) -> threading.Thread:
    async def go() -> None:
        async with grpc.aio.insecure_channel(addr) as ch:
            stub = grpc_service_pb2_grpc.GRPCInferenceServiceStub(ch)
            req = _request("noisy", NOISY_DIMS)

            async def worker() -> None:
                while not stop.is_set():
                    try:
                        await stub.ModelInfer(req, timeout=60)
                    except grpc.aio.AioRpcError as e:
                        errors.append(e.code().name)

            await asyncio.gather(*(worker() for _ in range(24)))

    t = threading.Thread(target=lambda: asyncio.run(go()), daemon=True)
    t.start()
    return t


def _stats(h: HostdProc, model: str) -> tuple[int, int, int, int]:
    """(requests, queue ns, batches, compute ns) from hostd's ModelStatistics."""
    s = h.stub.ModelStatistics(pb.ModelStatisticsRequest(name=model), timeout=10).model_stats[0]
    i = s.inference_stats
    return i.success.count, i.queue.ns, s.execution_count, i.compute_infer.ns


def test_a_light_model_waits_behind_no_noisy_batch(hostd):
    for model, dims in (("noisy", NOISY_DIMS), ("light", LIGHT_DIMS)):  # loaded and measured before
        for _ in range(10):
            hostd.stub.ModelInfer(_request(model, dims), timeout=60)
    stop, errors = threading.Event(), []
    t = _noisy_load(hostd.addr, stop, errors)
    try:
        deadline = time.monotonic() + 30
        while _stats(hostd, "noisy")[2] < 20 and time.monotonic() < deadline:  # the noisy load is under way
            time.sleep(0.1)
        light0, noisy0 = _stats(hostd, "light"), _stats(hostd, "noisy")
        light_req = _request("light", LIGHT_DIMS)
        for _ in range(40):
            hostd.stub.ModelInfer(light_req, timeout=30)
            time.sleep(0.005)  # arrivals spread over the noisy batches
        light1, noisy1 = _stats(hostd, "light"), _stats(hostd, "noisy")
    finally:
        stop.set()
        t.join(60)
    assert not errors, errors[:5]
    requests, queue_ns = light1[0] - light0[0], light1[1] - light0[1]
    batches, compute_ns = noisy1[2] - noisy0[2], noisy1[3] - noisy0[3]
    assert requests == 40 and batches >= 5, (requests, batches)
    light_queue, noisy_batch = queue_ns / requests, compute_ns / batches
    assert light_queue < 0.5 * noisy_batch, (f"light waited {light_queue / 1e6:.2f} ms on average for a slot; one noisy "
                                       f"batch computes in {noisy_batch / 1e6:.2f} ms")
