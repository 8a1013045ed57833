"""Tenant uploads through a real router (the shared cluster: moto_server, redis-server, three hostds; a router
of this module's own with uploads on): a tenant publishes with its API key and no store credentials and calls
the model at once; names that would leave its prefix, corrupt models, oversize files, missing or unknown keys
are refused and write nothing (the bucket is listed to prove it); another tenant's model of the same name is
neither seen nor touched."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import boto3
import grpc
import numpy as np
import pytest

from catalog.index import connect_redis
from ground.wire import REASON, UPLOADS_SERVICE
from mmhost.demo_models import build_onnx_mlp
from mmhost.upload_client import PublishFailed, RouterTarget, header, publish
from protos import uploads_pb2 as pb
from router.tenants import RedisTenants
from tests.router.conftest import IN_DIM, auth, infer_request
from tests.hostd_proc import metric_value
from tests.router.router_proc import RouterProc
from tests.router.test_cluster import hosts_up, wait_until
from tests.servers import REPO

LIMIT = 1 << 20


def _counted(router, outcome: str) -> None:
    """The upload just made is counted under `outcome`."""
    assert f'mmhost_router_uploads_total{{outcome="{outcome}",tenant="{TENANT}"}}' in router.metrics_text()


def _none_in_progress(router) -> None:
    text = router.metrics_text()
    assert "\nmmhost_router_uploads_in_progress " in text  # the series is there, not just summed to 0
    assert metric_value(text, "mmhost_router_uploads_in_progress") == 0


# The uploading tenant is this module's own: what it publishes (a model named like globex's included) stays
# out of the tenants the other modules of the shared cluster list and assert on.
TENANT = "uploader"
_KEY: dict[str, str] = {}


def _key(cluster) -> str:
    return _KEY[cluster.redis_url]


@pytest.fixture(scope="module")
def router(cluster, tmp_path_factory):
    _KEY[cluster.redis_url] = RedisTenants(connect_redis(cluster.redis_url), cluster.prefixes["tenants"]).create(TENANT)
    env = {**cluster.env, "MMHOST_ROUTER_UPLOADS": "true", "MMHOST_ROUTER_UPLOAD_MAX_BYTES": str(LIMIT)}
    r = RouterProc(tmp_path_factory.mktemp("upload-router"), cluster.router_args(), env)
    wait_until(lambda: hosts_up(r) >= len(cluster.alive()), timeout=60, what="the router to see every hostd")
    yield r
    r.stop()


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("upload-models")
    build_onnx_mlp(d / "a.onnx", (IN_DIM, 16, 4), seed=7)
    build_onnx_mlp(d / "b.onnx", (IN_DIM, 16, 4), seed=8)
    (d / "corrupt.onnx").write_bytes(b"\x08\x07" + os.urandom(4096))
    (d / "big.onnx").write_bytes(os.urandom(LIMIT + 1))
    return d


def _bucket(cluster) -> tuple[object, str, str]:
    bucket, prefix = cluster.store.removeprefix("s3://").split("/", 1)
    client = boto3.session.Session().client("s3", endpoint_url=cluster.env["MMHOST_S3_ENDPOINT_URL"],
                                            region_name="us-east-1")
    return client, bucket, prefix + "/"


def _keys(cluster) -> dict[str, str]:
    """Every object in the store: key (relative to the store's root) -> ETag."""
    client, bucket, prefix = _bucket(cluster)
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        out.update({o["Key"][len(prefix):]: o["ETag"] for o in page.get("Contents", [])})
    return out


def _manifest(cluster, key: str) -> dict:
    client, bucket, prefix = _bucket(cluster)
    return json.loads(client.get_object(Bucket=bucket, Key=prefix + key)["Body"].read())


def _target(router, key: str) -> RouterTarget:
    return RouterTarget(router.addr, key, plaintext=True, timeout_s=60)


def _want(path: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["output"], {"input": x})[0]


def _infer(router, key: str, model: str, version: str = "") -> np.ndarray:
    """The answer; UNAVAILABLE (a busy or briefly unseen host on a loaded test machine) is retried for 30 s,
    anything else (NOT_FOUND: the model not callable) fails at once."""
    req = infer_request(model, rows=2)
    req.model_version = version
    t0 = time.monotonic()
    while True:
        try:
            res = router.stub.ModelInfer(req, metadata=auth(key), timeout=60)
            break
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() - t0 > 30:
                raise
            time.sleep(0.2)
    return np.frombuffer(res.raw_output_contents[0], dtype=np.float32).reshape(2, -1)


def _x() -> np.ndarray:
    return np.random.default_rng(0).random((2, IN_DIM), dtype=np.float32)


def _published(router, key: str, file: Path, model: str) -> pb.PublishResponse:
    """The router's answer to an upload that must succeed; a refusal fails the test with the router's last
    logged error (an INTERNAL answer says no more than a request id)."""
    try:
        return publish(_target(router, key), header(file, model), file)
    except PublishFailed as e:
        raise AssertionError(f"{e}{router.errors()}") from None


def _refused(router, key: str, file: Path, model: str, **kw) -> PublishFailed:
    with pytest.raises(PublishFailed) as e:
        publish(_target(router, key), header(file, model, **kw), file)
    return e.value


def test_a_tenant_uploads_with_its_key_and_no_store_credentials_then_calls_it(router, cluster, models):
    # the tenant's machine: no AWS_* and no MMHOST_S3_*/MMHOST_STORE in its environment; only the router and a key
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MMHOST_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    run = subprocess.run(
        [sys.executable, "-m", "mmhost.cli", "upload", str(models / "a.onnx"), "--router", router.addr, "--plaintext",
         "--api-key", _key(cluster), "--model", "uploaded", "--description", "by the tenant"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr + router.errors()
    assert run.stdout.strip() == "1"
    _counted(router, "ok")
    np.testing.assert_allclose(_infer(router, _key(cluster), "uploaded"), _want(models / "a.onnx", _x()),
                               rtol=1e-5, atol=1e-5)
    stored = sorted(k for k in _keys(cluster) if "/uploaded/" in k)
    assert stored == ["tenants/uploader/models/uploaded/1/manifest.json", "tenants/uploader/models/uploaded/1/model.onnx"]
    m = _manifest(cluster, "tenants/uploader/models/uploaded/1/manifest.json")
    assert (m["tenant"], m["model"], m["version"], m["description"]) == (TENANT, "uploaded", "1", "by the tenant")
    assert m["uploaded_by"].endswith("(API key)")
    # a second upload is version 2: callable by its number at once, and the default once the hostds' catalog
    # view has refreshed (a couple of seconds)
    res = _published(router, _key(cluster), models / "b.onnx", "uploaded")
    assert (res.version, res.indexed) == ("2", True)
    _none_in_progress(router)
    want = _want(models / "b.onnx", _x())
    np.testing.assert_allclose(_infer(router, _key(cluster), "uploaded", "2"), want, rtol=1e-5, atol=1e-5)
    t0 = time.monotonic()
    while not np.allclose(_infer(router, _key(cluster), "uploaded"), want, rtol=1e-5, atol=1e-5):
        assert time.monotonic() - t0 < 30, "version 2 never became the default"
        time.sleep(0.2)


def test_the_tenant_is_the_keys_whatever_the_client_says(router, cluster, models):
    f = models / "a.onnx"
    call = router.channel.stream_unary(f"/{UPLOADS_SERVICE}/Publish", request_serializer=pb.PublishRequest.SerializeToString,
                                       response_deserializer=pb.PublishResponse.FromString)
    from mmhost.upload_client import requests

    md = (*auth(_key(cluster)), ("mmhost-tenant", "globex"))
    res = call(requests(header(f, "claims_globex"), f), metadata=md, timeout=60)
    assert res.version == "1"
    stored = [k for k in _keys(cluster) if "/claims_globex/" in k]
    assert stored and all(k.startswith("tenants/uploader/models/claims_globex/") for k in stored)


@pytest.mark.parametrize("model,version", [
    ("../globex/models/x", ""), ("/abs", ""), ("a\x00b", ""), ("a/b", ""), ("..", ""), (".", ""), ("x" * 129, ""),
    ("", ""), ("ok", "../../globex/models/secret/1"), ("ok", "1/../2"), ("ok", ".."),
])
def test_names_that_would_leave_the_prefix_are_refused_and_write_nothing(router, cluster, models, model, version):
    before = _keys(cluster)
    e = _refused(router, _key(cluster), models / "a.onnx", model, version=version)
    assert e.code == "INVALID_ARGUMENT", e
    assert _keys(cluster) == before


def test_a_corrupt_model_is_refused_and_leaves_no_manifest(router, cluster, models):
    before = _keys(cluster)
    e = _refused(router, _key(cluster), models / "corrupt.onnx", "corrupt")
    assert (e.code, e.reason) == ("INVALID_ARGUMENT", "model_invalid")
    _counted(router, "model_invalid")
    assert "corrupt does not load as onnx" in str(e)
    assert _keys(cluster) == before
    pickle_file = models / "pickle.pt"
    pickle_file.write_bytes(b"\x80\x04" + b"x" * 64)
    e = _refused(router, _key(cluster), pickle_file, "pickled")
    assert (e.code, e.reason) == ("INVALID_ARGUMENT", "model_invalid") and "pickle" in str(e)
    assert _keys(cluster) == before
    _none_in_progress(router)


def test_an_oversize_upload_is_refused_before_it_is_all_sent(router, cluster, models):
    before = _keys(cluster)
    e = _refused(router, _key(cluster), models / "big.onnx", "big")  # the header says so: refused at once
    assert (e.code, e.reason) == ("RESOURCE_EXHAUSTED", "upload_too_large")
    _counted(router, "upload_too_large")
    # a client that states no size: refused once the bytes pass the limit, long before it has sent them all
    sent = itertools.count()
    chunk = b"\0" * (64 << 10)

    def endless():
        yield pb.PublishRequest(header=pb.PublishHeader(model="big"))
        for _ in range(1024):  # 64 MiB
            next(sent)
            yield pb.PublishRequest(chunk=chunk)

    call = router.channel.stream_unary(f"/{UPLOADS_SERVICE}/Publish", request_serializer=pb.PublishRequest.SerializeToString,
                                       response_deserializer=pb.PublishResponse.FromString)
    with pytest.raises(grpc.RpcError) as err:
        call(endless(), metadata=auth(_key(cluster)), timeout=60)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert dict(err.value.trailing_metadata())[REASON] == "upload_too_large"
    # the limit, plus the stream window (stream_window_bytes, 1 MiB) and what gRPC buffers: 2.0 MB measured
    assert next(sent) * len(chunk) < 4 * LIMIT
    assert _keys(cluster) == before
    _none_in_progress(router)


@pytest.mark.parametrize("key", [None, "mmk_" + "A" * 43, "not-a-key"])
def test_a_missing_or_unknown_key_is_unauthenticated(router, cluster, models, key):
    before = _keys(cluster)
    f = models / "a.onnx"
    call = router.channel.stream_unary(f"/{UPLOADS_SERVICE}/Publish", request_serializer=pb.PublishRequest.SerializeToString,
                                       response_deserializer=pb.PublishResponse.FromString)
    from mmhost.upload_client import requests

    with pytest.raises(grpc.RpcError) as err:
        call(requests(header(f, "anon"), f), metadata=auth(key) if key else (), timeout=60)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert _keys(cluster) == before


def _metadata(router, key: str, model: str):
    from protos import grpc_service_pb2 as gpb

    return router.stub.ModelMetadata(gpb.ModelMetadataRequest(name=model), metadata=auth(key), timeout=30)


def test_another_tenants_model_of_the_same_name_is_neither_seen_nor_touched(router, cluster, models):
    mine, globex = _key(cluster), cluster.keys["globex"]
    theirs = {k: v for k, v in _keys(cluster).items() if k.startswith("tenants/globex/models/secret/")}
    # globex's model as globex sees it (metadata: no inference, so it is not loaded, and the shared cluster's
    # other modules still find it absent from every hostd)
    globex_before = _metadata(router, globex, "secret")
    # the uploader names globex's model: it gets version 1 of a model of its own (numbering sees only its prefix)
    res = _published(router, mine, models / "a.onnx", "secret")
    assert res.version == "1"
    after = _keys(cluster)
    assert {k: v for k, v in after.items() if k.startswith("tenants/globex/models/secret/")} == theirs
    assert "tenants/uploader/models/secret/1/manifest.json" in after
    np.testing.assert_allclose(_infer(router, mine, "secret"), _want(models / "a.onnx", _x()), rtol=1e-5, atol=1e-5)
    assert _metadata(router, globex, "secret") == globex_before
    # and a version of its own that exists is refused as such, not overwritten
    e = _refused(router, mine, models / "b.onnx", "secret", version="1")
    assert (e.code, e.reason) == ("ALREADY_EXISTS", "version_exists")
    assert _keys(cluster)["tenants/uploader/models/secret/1/model.onnx"] == after["tenants/uploader/models/secret/1/model.onnx"]
