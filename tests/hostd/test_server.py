"""hostd over real gRPC, real ONNX Runtime and torch models, in a separate process."""

from __future__ import annotations

import asyncio
import re

import grpc
import numpy as np
import onnxruntime as ort
import pytest

from hostd.tensors import encode_bytes_raw
from mmhost.demo_models import torch_reference
from protos import grpc_service_pb2 as pb
from protos import grpc_service_pb2_grpc
from tests.hostd_proc import metric_value


def infer_req(model="mlp", x=None, raw=True, name="input", version=""):
    x = np.random.default_rng(0).random((2, 64), dtype=np.float32) if x is None else x
    r = pb.ModelInferRequest(model_name=model, model_version=version, id="req-1")
    t = r.inputs.add(name=name, datatype="FP32", shape=list(x.shape))
    if raw:
        r.raw_input_contents.append(x.tobytes())
    else:
        t.contents.fp32_contents.extend(x.ravel().tolist())
    return r


def out_array(resp, i=0):
    o = resp.outputs[i]
    dt = {"FP32": np.float32, "FP16": np.float16, "INT64": np.int64, "INT32": np.int32, "BOOL": np.bool_}[o.datatype]
    return np.frombuffer(resp.raw_output_contents[i], dt).reshape(list(o.shape))


def local_mlp(demo_store, x, model="mlp"):
    path = demo_store / f"tenants/demo/models/{model}/1/model.onnx"
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(["output"], {"input": x})[0]


def test_server_and_model_metadata(hostd):
    s = hostd.stub
    assert s.ServerLive(pb.ServerLiveRequest()).live
    assert s.ServerReady(pb.ServerReadyRequest()).ready
    md = s.ServerMetadata(pb.ServerMetadataRequest())
    assert md.name == "mmhost" and "model_repository" in md.extensions
    mm = s.ModelMetadata(pb.ModelMetadataRequest(name="mlp"))
    assert mm.platform == "onnxruntime_onnx" and list(mm.versions) == ["1"]
    assert [(t.name, t.datatype, list(t.shape)) for t in mm.inputs] == [("input", "FP32", [-1, 64])]
    assert s.ModelReady(pb.ModelReadyRequest(name="mlp")).ready
    assert not s.ModelReady(pb.ModelReadyRequest(name="nope")).ready
    assert not s.ModelReady(pb.ModelReadyRequest(name="broken")).ready  # no manifest: not a model
    cfg = s.ModelConfig(pb.ModelConfigRequest(name="mlp")).config
    assert cfg.max_batch_size == 32 and list(cfg.input[0].dims) == [64] and cfg.instance_group[0].count == 1
    assert s.ModelConfig(pb.ModelConfigRequest(name="mlp_nobatch")).config.max_batch_size == 0


@pytest.mark.parametrize("raw", [True, False])
def test_onnx_results_equal_local_run(hostd, demo_store, raw):
    x = np.random.default_rng(1).random((3, 64), dtype=np.float32)
    resp = hostd.stub.ModelInfer(infer_req(x=x, raw=raw))
    assert resp.id == "req-1" and resp.model_name == "mlp" and resp.model_version == "1"
    if raw:
        got = out_array(resp)
    else:
        assert not resp.raw_output_contents  # typed in, typed out
        got = np.array(resp.outputs[0].contents.fp32_contents, np.float32).reshape(3, 10)
    np.testing.assert_allclose(got, local_mlp(demo_store, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model,name", [("scripted", "INPUT__0"), ("exported", "x")])
def test_torch_models(hostd, model, name):
    x = np.random.default_rng(2).random((5, 16), dtype=np.float32)
    resp = hostd.stub.ModelInfer(infer_req(model=model, x=x, name=name))
    np.testing.assert_allclose(out_array(resp), torch_reference(x), rtol=1e-5, atol=1e-6)


def test_every_datatype(hostd):
    r = pb.ModelInferRequest(model_name="typed")
    vals = {
        "in_f32": ("FP32", np.ones((2, 4), np.float32)),
        "in_i64": ("INT64", np.arange(8, dtype=np.int64).reshape(2, 4)),
        "in_i32": ("INT32", np.arange(8, dtype=np.int32).reshape(2, 4)),
        "in_b": ("BOOL", np.array([[True, False, True, False]] * 2)),
        "in_f16": ("FP16", np.full((2, 4), 1.5, np.float16)),
        "in_s": ("BYTES", np.array([[b"hi"], ["h\u00e9llo\x00".encode()]], dtype=object)),
    }
    for name, (dt, arr) in vals.items():
        r.inputs.add(name=name, datatype=dt, shape=list(arr.shape))
        r.raw_input_contents.append(encode_bytes_raw(arr) if dt == "BYTES" else arr.tobytes())
    resp = hostd.stub.ModelInfer(r)
    outs = {o.name: i for i, o in enumerate(resp.outputs)}
    assert (out_array(resp, outs["out_f32"]) == 2).all()
    assert out_array(resp, outs["out_i64"]).tolist() == (vals["in_i64"][1] + 1).tolist()
    assert out_array(resp, outs["out_i32"]).tolist() == vals["in_i32"][1].tolist()
    assert out_array(resp, outs["out_b"]).tolist() == [[False, True, False, True]] * 2
    assert (out_array(resp, outs["out_f16"]) == 1.5).all()
    raw_s = resp.raw_output_contents[outs["out_s"]]
    assert raw_s == encode_bytes_raw(np.array([b"hi", "h\u00e9llo\x00".encode()], dtype=object))

    # ONNX string tensors are UTF-8: other bytes are refused before they can fail a batch
    bad = pb.ModelInferRequest()
    bad.CopyFrom(r)
    bad.raw_input_contents[5] = encode_bytes_raw(np.array([b"ok", b"\xff\xfe"], dtype=object))
    with pytest.raises(grpc.RpcError) as ei:
        hostd.stub.ModelInfer(bad)
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "not valid UTF-8" in ei.value.details()

    # typed contents for the types that have a typed field; FP16 stays raw-only by the spec
    t = pb.ModelInferRequest(model_name="typed")
    for name, (dt, arr) in vals.items():
        i = t.inputs.add(name=name, datatype=dt, shape=list(arr.shape))
        if dt == "FP16":
            continue
        field = {"FP32": "fp32_contents", "INT64": "int64_contents", "INT32": "int_contents", "BOOL": "bool_contents",
                 "BYTES": "bytes_contents"}[dt]
        getattr(i.contents, field).extend(arr.ravel().tolist())
    with pytest.raises(grpc.RpcError) as ei:
        hostd.stub.ModelInfer(t)
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "FP16" in ei.value.details()


def _bad(kind):
    r = infer_req()
    if kind == "wrong_dtype":
        r.inputs[0].datatype = "INT32"
    elif kind == "wrong_rank":
        del r.inputs[0].shape[:]
        r.inputs[0].shape.extend([128])
    elif kind == "wrong_dim":
        r.inputs[0].shape[1] = 63
    elif kind == "batch_too_big":
        x = np.zeros((33, 64), np.float32)
        r = infer_req(x=x)
    elif kind == "missing_input":
        del r.inputs[:]
        del r.raw_input_contents[:]
    elif kind == "unknown_input":
        r.inputs[0].name = "inputx"
    elif kind == "duplicate_input":
        r.inputs.add().CopyFrom(r.inputs[0])
        r.raw_input_contents.append(r.raw_input_contents[0])
    elif kind == "raw_size":
        r.raw_input_contents[0] = r.raw_input_contents[0][:100]
    elif kind == "contents_count":
        r = infer_req(raw=False)
        del r.inputs[0].contents.fp32_contents[-1]
    elif kind == "raw_and_contents":
        r.inputs[0].contents.fp32_contents.append(1.0)
    elif kind == "raw_count":
        r.raw_input_contents.append(b"extra")
    elif kind == "unknown_output":
        r.outputs.add(name="logits")
    elif kind == "no_model_name":
        r.model_name = ""
    elif kind == "bad_priority":
        r.parameters["priority"].string_param = "high"
    return r


@pytest.mark.parametrize(
    "kind,pattern",
    [
        ("wrong_dtype", r"input 'input': expected datatype FP32, got INT32"),
        ("wrong_rank", r"input 'input': expected 2 dimensions"),
        ("wrong_dim", r"input 'input': dimension 1 must be 64"),
        ("batch_too_big", r"batch size 33 exceeds the model's max_batch_size 32"),
        ("missing_input", r"missing input\(s\) \['input'\]"),
        ("unknown_input", r"unknown input 'inputx'"),
        ("duplicate_input", r"input 'input' given more than once"),
        ("raw_size", r"raw content has 100 bytes"),
        ("contents_count", r"contents has 127 elements"),
        ("raw_and_contents", r"either contents or raw_input_contents"),
        ("raw_count", r"raw_input_contents has 2 entries"),
        ("unknown_output", r"unknown output 'logits'"),
        ("no_model_name", r"model_name is required"),
        ("bad_priority", r"parameter 'priority' must be an integer"),
    ],
)
def test_bad_requests_get_invalid_argument_and_server_keeps_serving(hostd, kind, pattern):
    with pytest.raises(grpc.RpcError) as ei:
        hostd.stub.ModelInfer(_bad(kind))
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT, ei.value.details()
    assert re.search(pattern, ei.value.details()), ei.value.details()
    assert hostd.stub.ModelInfer(infer_req()).outputs  # still serving


@pytest.mark.parametrize("model,version", [("nope", ""), ("mlp", "7"), ("broken", "")])
def test_unknown_model_or_version_is_not_found(hostd, model, version):
    with pytest.raises(grpc.RpcError) as ei:
        hostd.stub.ModelInfer(infer_req(model=model, version=version))
    assert ei.value.code() == grpc.StatusCode.NOT_FOUND
    assert model in ei.value.details()


def test_oversize_requests_are_refused(hostd):
    # this hostd runs with a 1 MiB request limit; gRPC's own limit sits 1 MiB above it
    big = np.zeros((32, 64 * 160), np.float32)  # 1.3 MB: passes gRPC, refused by validation
    r = pb.ModelInferRequest(model_name="mlp")
    r.inputs.add(name="input", datatype="FP32", shape=[32, 64])
    r.raw_input_contents.append(big.tobytes())
    with pytest.raises(grpc.RpcError) as ei:
        hostd.stub.ModelInfer(r)
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "size limit" in ei.value.details()
    huge = np.zeros((4 << 20) // 4, np.float32)  # 4 MB: refused by gRPC before decoding
    r.raw_input_contents[0] = huge.tobytes()
    with pytest.raises(grpc.RpcError) as ei:
        hostd.stub.ModelInfer(r)
    assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert hostd.stub.ModelInfer(infer_req()).outputs


async def _concurrent(addr, model, xs):
    async with grpc.aio.insecure_channel(addr) as ch:
        stub = grpc_service_pb2_grpc.GRPCInferenceServiceStub(ch)
        return await asyncio.gather(*(stub.ModelInfer(infer_req(model=model, x=x)) for x in xs))


@pytest.mark.parametrize("model", ["mlp_big", "mlp_nobatch"])
def test_concurrent_clients_never_mix_rows(hostd, demo_store, model):
    rng = np.random.default_rng(3)
    xs = [rng.random((int(rng.integers(1, 4)), 64), dtype=np.float32) for _ in range(96)]
    before = hostd.stub.ModelStatistics(pb.ModelStatisticsRequest(name=model)).model_stats[0]
    resps = asyncio.run(_concurrent(hostd.addr, model, xs))
    want = local_mlp(demo_store, np.concatenate(xs), model)
    off = 0
    for x, resp in zip(xs, resps, strict=True):
        np.testing.assert_allclose(out_array(resp), want[off : off + len(x)], rtol=1e-4, atol=1e-4)
        off += len(x)
    st = hostd.stub.ModelStatistics(pb.ModelStatisticsRequest(name=model)).model_stats[0]
    # Triton semantics: a model that does not batch counts one inference per request
    rows = sum(x.shape[0] for x in xs) if model != "mlp_nobatch" else len(xs)
    assert st.inference_count - before.inference_count == rows
    assert st.inference_stats.success.count - before.inference_stats.success.count == len(xs)
    executions = st.execution_count - before.execution_count
    if model == "mlp_nobatch":
        assert executions == len(xs)
        assert all(b.batch_size <= 3 for b in st.batch_stats)
    else:
        assert executions < len(xs)  # 96 requests in flight at once on one executor: batches formed
        assert max(b.batch_size for b in st.batch_stats) > 3


def test_statistics_and_metrics(hostd):
    for _ in range(3):
        hostd.stub.ModelInfer(infer_req(model="scripted", x=np.ones((1, 16), np.float32), name="INPUT__0"))
    st = hostd.stub.ModelStatistics(pb.ModelStatisticsRequest(name="scripted")).model_stats[0]
    assert st.inference_stats.success.count >= 3
    assert st.inference_stats.queue.count >= 3 and st.inference_stats.compute_infer.ns > 0
    assert st.last_inference > 0
    text = hostd.metrics_text()
    assert re.search(r'mmhost_requests_total\{model="scripted",status="OK",tenant="demo"\} [3-9]', text)
    assert 'mmhost_requests_total{model="(unknown)",status="NOT_FOUND",tenant="demo"}' in text
    for name in ("mmhost_queue_duration_seconds_bucket", "mmhost_compute_duration_seconds_bucket",
                 "mmhost_batch_size_bucket", "mmhost_model_load_duration_seconds_bucket", "mmhost_model_memory_bytes"):
        assert name in text
    # the loop-lag watch samples 20 times a second from start: a serving hostd has samples
    assert metric_value(text, "mmhost_event_loop_lag_seconds_count") > 0


def test_repository_index_load_unload(hostd):
    s = hostd.stub
    s.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="exported"))
    idx = {m.name: m for m in s.RepositoryIndex(pb.RepositoryIndexRequest()).models}
    assert idx["exported"].state == "READY" and "broken" not in idx
    s.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name="exported"))
    idx = {m.name: m for m in s.RepositoryIndex(pb.RepositoryIndexRequest()).models}
    assert idx["exported"].state == "UNAVAILABLE"
    ready = {m.name for m in s.RepositoryIndex(pb.RepositoryIndexRequest(ready=True)).models}
    assert "exported" not in ready
    x = np.ones((2, 16), np.float32)  # lazily loaded again on the next request
    np.testing.assert_allclose(out_array(s.ModelInfer(infer_req(model="exported", x=x, name="x"))), torch_reference(x),
                               rtol=1e-5, atol=1e-6)
    with pytest.raises(grpc.RpcError) as ei:
        s.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="nope"))
    assert ei.value.code() == grpc.StatusCode.NOT_FOUND


def test_health_and_reflection(hostd):
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    h = health_pb2_grpc.HealthStub(hostd.channel)
    r = h.Check(health_pb2.HealthCheckRequest(service="inference.GRPCInferenceService"))
    assert r.status == health_pb2.HealthCheckResponse.SERVING
    refl = reflection_pb2_grpc.ServerReflectionStub(hostd.channel)
    resp = next(iter(refl.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))))
    names = {s.name for s in resp.list_services_response.service}
    assert {"inference.GRPCInferenceService", "grpc.health.v1.Health"} <= names


def test_preloading_hostd_is_ready_only_when_every_model_is_loaded(demo_store, tmp_path):
    from tests.hostd_proc import HostdProc

    h = HostdProc(str(demo_store), tmp_path, args=["--preload"])  # returns once health says SERVING
    try:
        states = {m.model: m.state for m in h.status().models}
        assert states and set(states.values()) == {"READY"}, states
        assert {"mlp", "typed", "scripted", "exported", "mlp_big"} <= set(states)
        assert h.stub.ServerReady(pb.ServerReadyRequest()).ready
    finally:
        h.stop()
