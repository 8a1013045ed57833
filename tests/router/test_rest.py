"""KServe v2 REST on a real router process (`rest_listen`) in front of a real hostd, called with Triton's HTTP
client (tritonclient.http) the way tenants and perf_analyzer -i http call Triton: the same answers as gRPC
through the same servicer (health, metadata, config, JSON and binary inference, statistics, repository), the
same keys and tenancy (another tenant's model is 404 exactly like a missing one, no key is 401), sheds with
Retry-After, and 400 for malformed bodies. Then the adapter in-process over a stub servicer: each gRPC code's
HTTP status and headers, the body bound, health while draining."""

from __future__ import annotations

import asyncio
import gzip
import http.client
import json
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
import tritonclient.http as httpclient
from aiohttp.test_utils import TestClient, TestServer
from tritonclient.utils import InferenceServerException

import ground.errors as errors
from mmhost.demo_models import build_onnx_mlp, onnx_manifest
from catalog.publish import publish_version
from catalog.repository import ModelRepository
from protos import grpc_service_pb2 as pb
from router import rest_codec as codec
from router.rest import RestApi
from router.tenants import FileTenants
from storage_adapters.local import LocalStorage
from tests.hostd_proc import HostdProc
from tests.router.router_proc import RouterProc
from tests.servers import free_port

IN_DIM, OUT_DIM = 8, 4


class Rig:
    def __init__(self, router: RouterProc, rest_port: int, keys: dict[str, str]) -> None:
        self.router, self.port, self.keys = router, rest_port, keys
        self.url = f"127.0.0.1:{rest_port}"

    def client(self, **kw) -> httpclient.InferenceServerClient:
        return httpclient.InferenceServerClient(self.url, **kw)

    def request(self, method: str, path: str, body: bytes = b"", headers: dict | None = None):
        """(status, headers, body) of one plain HTTP call, as curl or a load balancer makes it."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            r = conn.getresponse()
            return r.status, r.headers, r.read()
        finally:
            conn.close()


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    work = tmp_path_factory.mktemp("rest")
    store = work / "store"
    repo = ModelRepository(LocalStorage(store))
    build_onnx_mlp(work / "mlp.onnx", (IN_DIM, 16, OUT_DIM))
    for tenant, model in (("acme", "mlp"), ("acme", "other"), ("globex", "secret"), ("slowco", "mlp")):
        publish_version(repo, onnx_manifest(tenant, model, "1", work / "mlp.onnx", "model.onnx"),
                        {"model.onnx": work / "mlp.onnx"})
    f = work / "tenants.json"
    reg = FileTenants(f)
    keys = {"acme": reg.create("acme"), "globex": reg.create("globex"),
            "slowco": reg.create("slowco", "free", {"rate": 0.2, "burst": 1})}
    h = HostdProc(str(store), work, args=["--tenant-limits", str(f)], tenant="nobody")
    port = free_port()
    r = RouterProc(work, ["--hosts", h.addr, "--tenants", str(f), "--store", str(store), "--refresh-interval", "0.2",
                          "--rest-listen", f"127.0.0.1:{port}"])
    rig = Rig(r, port, keys)
    deadline = time.monotonic() + 20
    while not rig.client().is_server_ready():  # the router has seen the hostd
        assert time.monotonic() < deadline, r.log()
        time.sleep(0.1)
    yield rig
    r.stop()
    h.stop()


def x_of(rows: int) -> np.ndarray:
    return np.random.default_rng(rows).random((rows, IN_DIM), dtype=np.float32)


def grpc_infer(rig: Rig, model: str, x: np.ndarray, key: str) -> np.ndarray:
    req = pb.ModelInferRequest(model_name=model, inputs=[pb.ModelInferRequest.InferInputTensor(
        name="input", datatype="FP32", shape=list(x.shape))], raw_input_contents=[x.tobytes()])
    resp = rig.router.stub.ModelInfer(req, metadata=tuple(auth(key).items()), timeout=30)
    return np.frombuffer(resp.raw_output_contents[0], np.float32).reshape(tuple(resp.outputs[0].shape))


def failure(fn, *args, **kw) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as e:
        fn(*args, **kw)
    return e.value


# -- health and server ------------------------------------------------------------------------------------


def test_health_answers_load_balancers_without_a_key(rig):
    c = rig.client()
    assert c.is_server_live() and c.is_server_ready()
    for path in ("/v2/health/live", "/v2/health/ready"):
        status, _, body = rig.request("GET", path)
        assert (status, body) == (200, b"")
        assert rig.request("HEAD", path)[0] == 200


def test_server_metadata_as_on_grpc_and_only_with_a_key(rig):
    H = auth(rig.keys["acme"])
    md = rig.client().get_server_metadata(headers=H)
    g = rig.router.stub.ServerMetadata(pb.ServerMetadataRequest(), metadata=tuple(H.items()), timeout=10)
    assert md == codec.message_json(g) and md["name"] == "mmhost-router" and "binary_tensor_data" in md["extensions"]
    assert failure(rig.client().get_server_metadata).status() == "401"
    assert failure(rig.client().get_server_metadata, headers={"authorization": "Bearer mmk_nope"}).status() == "401"
    status, headers, body = rig.request("GET", "/v2", headers={"Authorization": "Basic eDp5"})
    assert status == 401 and "error" in json.loads(body) and headers["mmhost-reason"] == "unauthenticated"


# -- models ---------------------------------------------------------------------------------------------


def test_model_metadata_config_and_readiness_match_grpc(rig):
    H = auth(rig.keys["acme"])
    md = tuple(H.items())
    c = rig.client()
    meta = c.get_model_metadata("mlp", headers=H)
    assert meta == codec.message_json(rig.router.stub.ModelMetadata(pb.ModelMetadataRequest(name="mlp"), metadata=md,
                                                                    timeout=30))
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, IN_DIM]}]
    assert c.get_model_metadata("mlp", "1", headers=H)["name"] == "mlp"
    config = c.get_model_config("mlp", headers=H)
    assert config == codec.message_json(rig.router.stub.ModelConfig(pb.ModelConfigRequest(name="mlp"), metadata=md,
                                                                     timeout=30).config)
    assert config["name"] == "mlp" and config["input"][0]["data_type"] == "TYPE_FP32"
    assert c.is_model_ready("mlp", headers=H) and c.is_model_ready("mlp", "1", headers=H)


def test_another_tenants_model_is_404_exactly_like_a_missing_one(rig):
    H = auth(rig.keys["acme"])
    c = rig.client()
    for call in (c.get_model_metadata, c.get_model_config):
        theirs, missing = failure(call, "secret", headers=H), failure(call, "nosuch", headers=H)
        assert theirs.status() == missing.status() == "404"
        assert theirs.message().replace("secret", "X") == missing.message().replace("nosuch", "X")
    inp = httpclient.InferInput("input", [1, IN_DIM], "FP32").set_data_from_numpy(x_of(1))
    assert failure(c.infer, "secret", [inp], headers=H).status() == "404"
    assert not c.is_model_ready("secret", headers=H) and not c.is_model_ready("nosuch", headers=H)
    assert c.get_model_metadata("secret", headers=auth(rig.keys["globex"]))["name"] == "secret"
    status, headers, body = rig.request("GET", "/v2/models/secret", headers=H)
    assert status == 404 and headers["mmhost-reason"] == "not_found" and set(json.loads(body)) == {"error"}


# -- inference ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("binary_in, binary_out", [(False, False), (True, True), (False, True), (True, False)])
def test_inference_in_json_and_binary_matches_grpc(rig, binary_in, binary_out):
    key = rig.keys["acme"]
    x = x_of(3)
    inp = httpclient.InferInput("input", [3, IN_DIM], "FP32").set_data_from_numpy(x, binary_data=binary_in)
    out = httpclient.InferRequestedOutput("output", binary_data=binary_out)
    res = rig.client().infer("mlp", [inp], outputs=[out], request_id="r-1", headers=auth(key))
    np.testing.assert_allclose(res.as_numpy("output"), grpc_infer(rig, "mlp", x, key), rtol=1e-6)
    got = res.get_response()
    assert (got["model_name"], got["id"]) == ("mlp", "r-1")
    assert ("data" in got["outputs"][0]) is not binary_out


def test_inference_without_outputs_named_returns_all_in_binary(rig):
    inp = httpclient.InferInput("input", [2, IN_DIM], "FP32").set_data_from_numpy(x_of(2), binary_data=False)
    res = rig.client().infer("mlp", [inp], headers=auth(rig.keys["acme"]), model_version="1")
    assert res.as_numpy("output").shape == (2, OUT_DIM)
    assert res.get_output("output")["parameters"]["binary_data_size"] == 2 * OUT_DIM * 4


def test_inference_as_curl_sends_it(rig):
    body = json.dumps({"inputs": [{"name": "input", "shape": [1, IN_DIM], "datatype": "FP32",
                                   "data": x_of(1).flatten().tolist()}]}).encode()
    status, headers, raw = rig.request("POST", "/v2/models/mlp/infer", body,
                                       {"Authorization": f"Bearer {rig.keys['acme']}", "Content-Type": "application/json"})
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    out = json.loads(raw)["outputs"][0]
    assert (out["name"], out["datatype"], out["shape"], len(out["data"])) == ("output", "FP32", [1, OUT_DIM], OUT_DIM)


def test_a_missing_key_is_401_before_the_body_is_read(rig):
    inp = httpclient.InferInput("input", [1, IN_DIM], "FP32").set_data_from_numpy(x_of(1))
    assert failure(rig.client().infer, "mlp", [inp]).status() == "401"
    status, headers, body = rig.request("POST", "/v2/models/mlp/infer", b"not json at all")
    assert status == 401 and headers["mmhost-reason"] == "unauthenticated"


def test_malformed_json_and_binary_bodies_are_400(rig):
    H = auth(rig.keys["acme"])
    x = x_of(1).tobytes()
    head = json.dumps({"inputs": [{"name": "input", "shape": [1, IN_DIM], "datatype": "FP32",
                                   "parameters": {"binary_data_size": len(x)}}]}).encode()
    cases = [
        (b'{"inputs": [', {}, "malformed JSON"),
        (b'{"inputs": [{"name": "input", "shape": [1, 8], "datatype": "FP8", "data": [1]}]}', {}, "unknown datatype"),
        (b'{"inputs": [{"name": "input", "shape": [1, 8], "datatype": "FP32", "data": [1, 2]}]}', {}, "2 elements"),
        (head + x[:-4], {"Inference-Header-Content-Length": str(len(head))}, "runs past the binary data"),
        (head + x + b"xx", {"Inference-Header-Content-Length": str(len(head))}, "after the last binary input"),
        (head + x, {"Inference-Header-Content-Length": str(len(head) + 999)}, "Inference-Header-Content-Length is"),
    ]
    for body, extra, words in cases:
        status, headers, raw = rig.request("POST", "/v2/models/mlp/infer", body, {**H, **extra})
        assert status == 400, raw
        assert words in json.loads(raw)["error"] and headers["mmhost-reason"] == "invalid_argument"
    status, _, raw = rig.request("GET", "/v2/no/such/route", headers=H)
    assert status == 404 and "error" in json.loads(raw)


def test_a_shed_is_429_with_retry_after(rig):
    H = {**auth(rig.keys["slowco"]), "Content-Type": "application/json"}
    body = json.dumps({"inputs": [{"name": "input", "shape": [1, IN_DIM], "datatype": "FP32",
                                   "data": x_of(1).flatten().tolist()}]}).encode()
    answers = [rig.request("POST", "/v2/models/mlp/infer", body, H) for _ in range(3)]  # burst 1 at 0.2/s
    shed = [a for a in answers if a[0] == 429]
    assert shed, [a[0] for a in answers]
    status, headers, raw = shed[0]
    assert headers["mmhost-reason"] == "quota_rate" and int(headers["Retry-After"]) >= 1
    assert int(headers["Retry-After"]) == -(-int(headers["retry-after-ms"]) // 1000)
    assert set(json.loads(raw)) == {"error"}


def test_concurrent_http_clients_all_succeed(rig):
    key = rig.keys["acme"]
    x = x_of(4)
    want = grpc_infer(rig, "mlp", x, key)

    def worker(i: int) -> int:
        c = rig.client(connection_timeout=30, network_timeout=30)
        inp = httpclient.InferInput("input", [4, IN_DIM], "FP32").set_data_from_numpy(x, binary_data=i % 2 == 0)
        for _ in range(15):
            np.testing.assert_allclose(c.infer("mlp", [inp], headers=auth(key)).as_numpy("output"), want, rtol=1e-6)
        c.close()
        return 15

    with ThreadPoolExecutor(6) as ex:
        assert sum(ex.map(worker, range(6))) == 90


# -- statistics and the repository ----------------------------------------------------------------------------


def test_statistics_as_triton_shows_them(rig):
    H = auth(rig.keys["acme"])
    c = rig.client()
    inp = httpclient.InferInput("input", [1, IN_DIM], "FP32").set_data_from_numpy(x_of(1))
    c.infer("mlp", [inp], headers=H)
    stats = c.get_inference_statistics("mlp", headers=H)["model_stats"]
    assert [s["name"] for s in stats] == ["mlp"] and stats[0]["inference_count"] >= 1
    success = stats[0]["inference_stats"]["success"]
    assert isinstance(success["count"], int) and success["count"] >= 1 and "fail" in stats[0]["inference_stats"]
    assert {s["name"] for s in c.get_inference_statistics(headers=H)["model_stats"]} <= {"mlp", "other"}
    assert failure(c.get_inference_statistics, "secret", headers=H).status() == "404"


def test_repository_index_load_and_unload(rig):
    H = auth(rig.keys["acme"])
    c = rig.client()
    index = c.get_model_repository_index(headers=H)
    assert {m["name"] for m in index} == {"mlp", "other"} and all(set(m) >= {"name", "version", "state"} for m in index)
    c.load_model("other", headers=H)
    assert c.is_model_ready("other", headers=H)
    deadline = time.monotonic() + 10
    while not any(m["name"] == "other" and m["state"] == "READY" for m in c.get_model_repository_index(headers=H)):
        assert time.monotonic() < deadline  # the index shows hosts' states at the router's next refresh
        time.sleep(0.1)
    c.unload_model("other", headers=H)
    deadline = time.monotonic() + 10
    while any(m["name"] == "other" and m["state"] == "READY" for m in c.get_model_repository_index(headers=H)):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    grpc_ready = rig.router.stub.ModelReady(pb.ModelReadyRequest(name="other"), metadata=tuple(H.items()), timeout=10)
    assert c.is_model_ready("other", headers=H) == grpc_ready.ready  # whatever the hostd says, REST says the same
    assert failure(c.load_model, "secret", headers=H).status() == "404"
    assert failure(c.unload_model, "nosuch", headers=H).status() == "404"
    status, _, raw = rig.request("POST", "/v2/repository/models/other/load", b'{"parameters": {"pin": true}}', H)
    assert status == 403 and "operator" in json.loads(raw)["error"]


# -- the adapter in-process, over a stub servicer: status mapping, bounds, health ------------------------------


class StubServicer:
    """What RestApi calls on a RouterServicer: ServerLive (authentication) and ModelInfer, recording contexts."""

    def __init__(self, error: Exception | None = None, hosts: int = 1) -> None:
        self.error, self.contexts = error, []
        self.cluster = type("Hosts", (), {"eligible": staticmethod(lambda: ["h"] * hosts)})()

    async def ServerLive(self, body: bytes, context) -> bytes:
        if not context.invocation_metadata():
            raise errors.Unauthenticated("no key")
        return b""

    async def ModelInfer(self, body: bytes, context) -> bytes:
        self.contexts.append(context)
        if self.error is not None:
            raise self.error
        req = pb.ModelInferRequest.FromString(body)
        resp = pb.ModelInferResponse(model_name=req.model_name, outputs=[
            pb.ModelInferResponse.InferOutputTensor(name="y", datatype="INT32", shape=[1])])
        resp.raw_output_contents.append(np.array([7], np.int32).tobytes())
        return resp.SerializeToString()


def call(api, method: str, path: str, body: bytes = b"", headers: dict | None = None):
    async def go():
        async with TestClient(TestServer(api.app())) as c:
            r = await c.request(method, path, data=body, headers=headers or {})
            return r.status, r.headers, await r.read()

    return asyncio.run(go())


JSON_BODY = json.dumps({"inputs": [{"name": "x", "datatype": "INT32", "shape": [1], "data": [1]}]}).encode()


def test_adapter_passes_the_key_as_metadata_and_no_deadline():
    stub = StubServicer()
    status, _, raw = call(RestApi(stub, 1 << 20), "POST", "/v2/models/m/infer", JSON_BODY, {"Authorization": "Bearer k"})
    assert status == 200 and json.loads(raw)["outputs"][0]["data"] == [7]
    ctx = stub.contexts[0]
    assert ctx.invocation_metadata() == (("authorization", "Bearer k"),) and ctx.time_remaining() is None


@pytest.mark.parametrize("error, status", [
    ("InvalidArgument", 400), ("Unauthenticated", 401), ("PermissionDenied", 403), ("NotFound", 404),
    ("ResourceExhausted", 429), ("Unavailable", 503), ("DeadlineExceeded", 504), ("Internal", 500),
])
def test_serving_errors_become_http_statuses(error, status):
    err = getattr(errors, error)("went wrong", retry_after_ms=1001 if status in (429, 503) else None, reason="r1")
    got, headers, raw = call(RestApi(StubServicer(err), 1 << 20), "POST", "/v2/models/m/infer", JSON_BODY,
                             {"Authorization": "Bearer k"})
    assert got == status and json.loads(raw)["error"] == "went wrong" and headers["mmhost-reason"] == "r1"
    assert headers.get("Retry-After") == ("2" if status in (429, 503) else None)  # 1001 ms: rounded up


def test_forwarded_codes_and_bugs():
    err = errors.Forwarded(grpc.StatusCode.FAILED_PRECONDITION, "host says no", reason="model_failed")
    status, headers, _ = call(RestApi(StubServicer(err), 1 << 20), "POST", "/v2/models/m/infer", JSON_BODY,
                              {"Authorization": "Bearer k"})
    assert (status, headers["mmhost-reason"]) == (400, "model_failed")
    status, headers, raw = call(RestApi(StubServicer(RuntimeError("secret /etc/path")), 1 << 20), "POST",
                                "/v2/models/m/infer", JSON_BODY, {"Authorization": "Bearer k"})
    assert status == 500 and "internal error (request id" in json.loads(raw)["error"] and b"secret" not in raw


def test_bodies_past_the_bound_wrong_methods_and_unknown_routes_are_json_errors():
    api = RestApi(StubServicer(), 1024)
    status, _, raw = call(api, "POST", "/v2/models/m/infer", b"x" * 2000, {"Authorization": "Bearer k"})
    assert status == 413 and "error" in json.loads(raw)
    status, headers, raw = call(api, "GET", "/v2/models/m/infer", headers={"Authorization": "Bearer k"})
    assert status == 405 and "POST" in headers["Allow"] and "error" in json.loads(raw)
    assert call(api, "GET", "/v3")[0] == 404


def test_ready_is_400_without_hosts_and_while_draining():
    assert call(RestApi(StubServicer(hosts=0), 1024), "GET", "/v2/health/ready")[0] == 400
    api = RestApi(StubServicer(), 1024)
    assert call(api, "GET", "/v2/health/ready")[0] == 200
    api.draining = True
    assert call(api, "GET", "/v2/health/ready")[0] == 400
    assert call(api, "GET", "/v2/health/live")[0] == 200


def test_compressed_request_bodies_are_read_as_tritonclient_sends_them():
    stub = StubServicer()
    status, _, raw = call(RestApi(stub, 1 << 20), "POST", "/v2/models/m/infer", gzip.compress(JSON_BODY),
                          {"Authorization": "Bearer k", "Content-Encoding": "gzip"})
    assert status == 200 and json.loads(raw)["outputs"][0]["data"] == [7]
