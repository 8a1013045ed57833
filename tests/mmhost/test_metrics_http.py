"""The Prometheus port of a real hostd and router: Triton's nv_inference_* series (after an inference) and the
process_* series on /metrics, and 404 for every other path (an HTTP health check pointed there must fail); a
connection that sends no request, or stops halfway through one, is closed rather than holding a thread."""

from __future__ import annotations

import urllib.error
import urllib.request

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from ground.metrics_http import serve_metrics
from hostd.metrics import HostdMetrics
from hostd.stats import ModelStats
from protos import grpc_service_pb2 as pb
from tests.hostd_proc import HostdProc, metric_value

TRITON = ("nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
          "nv_inference_exec_count", "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
          "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
          "nv_inference_compute_output_duration_us")


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_metrics_port_serves_metrics_only():
    reg = CollectorRegistry()
    srv = serve_metrics("127.0.0.1", 0, reg)
    try:
        assert get(srv.port, "/metrics")[0] == 200
        for path in ("/", "/v2/health/ready", "/v2/health/live", "/metricsx"):
            assert get(srv.port, path)[0] == 404, path
    finally:
        srv.close()


def test_a_silent_or_stalled_connection_is_closed_and_scrapes_go_on():
    import socket

    srv = serve_metrics("127.0.0.1", 0, CollectorRegistry(), read_s=0.3)
    try:
        for sent in (b"", b"GET /metr"):
            with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
                s.sendall(sent)
                assert s.recv(100) == b""  # closed by the server after read_s, nothing answered
                assert get(srv.port, "/metrics")[0] == 200
    finally:
        srv.close()


def test_triton_series_read_model_statistics_at_scrape_time():
    m = HostdMetrics()
    st = ModelStats()
    st.success.add(2_000_000)
    st.record_queue(0.001)
    st.record_batch(rows=4, input_ns=3000, infer_ns=500_000, output_ns=2000, requests=2)
    m.watch(lambda: [(("acme", "resnet", "3"), type("E", (), {"stats": st})())])
    from prometheus_client import generate_latest

    text = generate_latest(m.registry).decode()
    labels = {"tenant": "acme", "model": "resnet", "version": "3"}
    assert metric_value(text, "nv_inference_request_success", **labels) == 1
    assert metric_value(text, "nv_inference_count", **labels) == 4
    assert metric_value(text, "nv_inference_exec_count", **labels) == 1
    assert metric_value(text, "nv_inference_request_duration_us", **labels) == 2000
    assert metric_value(text, "nv_inference_compute_infer_duration_us", **labels) == 500
    assert "nv_gpu_" not in text  # no NVML probe: absent, as on a Triton without GPUs
    assert "process_resident_memory_bytes" in text and "python_gc_objects_collected" in text


@pytest.fixture(scope="module")
def hostd(tmp_path_factory):
    from mmhost.demo_models import seed_store

    store = tmp_path_factory.mktemp("metrics-store")
    seed_store(store, tenant="acme")
    h = HostdProc(str(store), tmp_path_factory.mktemp("metrics-hostd"), tenant="acme", args=["--lazy"])
    yield h
    h.stop()


def test_hostd_metrics_port(hostd):
    x = np.random.rand(2, 64).astype(np.float32)
    req = pb.ModelInferRequest(model_name="mlp", raw_input_contents=[x.tobytes()],
                               inputs=[pb.ModelInferRequest.InferInputTensor(name="input", datatype="FP32", shape=[2, 64])])
    hostd.stub.ModelInfer(req, metadata=(("mmhost-tenant", "acme"),), timeout=60)
    code, text = get(hostd.metrics_port, "/metrics")
    assert code == 200
    for name in TRITON:
        assert f"\n{name}{{" in text, name
    assert metric_value(text, "nv_inference_request_success", model="mlp", tenant="acme") == 1
    assert metric_value(text, "nv_inference_count", model="mlp", tenant="acme") == 2
    assert metric_value(text, "process_resident_memory_bytes") > 0
    assert get(hostd.metrics_port, "/v2/health/ready")[0] == 404


def test_router_metrics_port(hostd, tmp_path):
    from tests.router.router_proc import RouterProc

    tenants = tmp_path / "tenants.json"
    tenants.write_text('{"tenants": {}}')
    r = RouterProc(tmp_path, ["--hosts", hostd.addr, "--tenants", str(tenants)])
    try:
        code, text = get(r.metrics_port, "/metrics")
        assert code == 200 and metric_value(text, "process_resident_memory_bytes") > 0
        assert "mmhost_router_hosts_up" in text
        assert get(r.metrics_port, "/v2/health/ready")[0] == 404
    finally:
        r.stop()


def test_gpu_series_come_from_an_nvml_probe_only():
    from prometheus_client import generate_latest

    class FakeNvml:  # the NvmlProbe surface the collector reads
        uuid = "GPU-1234"

        def used(self) -> int:
            return 3 << 30

        def total(self) -> int:
            return 80 << 30

        def utilization(self) -> float:
            return 0.25

    m = HostdMetrics()
    m.watch(lambda: [], FakeNvml())
    text = generate_latest(m.registry).decode()
    assert metric_value(text, "nv_gpu_memory_used_bytes", gpu_uuid="GPU-1234") == 3 << 30
    assert metric_value(text, "nv_gpu_memory_total_bytes", gpu_uuid="GPU-1234") == 80 << 30
    assert metric_value(text, "nv_gpu_utilization", gpu_uuid="GPU-1234") == 0.25
    from hostd.memory import CpuProbe

    m.watch(lambda: [], CpuProbe())
    assert "nv_gpu_" not in generate_latest(m.registry).decode()
