"""What tenants read, through a real router and hostd: pinning is an operator action (PERMISSION_DENIED at the
router, whatever the model), NOT_FOUND messages stay short whatever name was sent, messages name no store
path or endpoint (the details are in the log under the request id the caller also gets), and a router
without a catalog does not answer OK to unloading a name no host knows."""

from __future__ import annotations

import grpc
import pytest

from catalog.publish import publish_version
from catalog.repository import ModelRepository
from ground.wire import REASON, REQUEST_ID, TENANT_HEADER
from mmhost.demo_models import build_onnx_mlp, onnx_manifest
from protos import grpc_service_pb2 as pb
from storage_adapters.local import LocalStorage
from tests.isolation.conftest import auth, fast_request
from tests.router.router_proc import RouterProc

C = grpc.StatusCode


def _err(call, *args, **kw) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as ei:
        call(*args, **kw)
    return ei.value


def _trailers(e: grpc.RpcError) -> dict[str, str]:
    return dict(e.trailing_metadata() or ())


def _load(name: str, **params) -> pb.RepositoryModelLoadRequest:
    r = pb.RepositoryModelLoadRequest(model_name=name)
    for k, v in params.items():
        r.parameters[k].bool_param = v
    return r


def test_a_tenant_cannot_pin_through_the_router(isolated):
    r, key = isolated.router, isolated.keys["light"]
    for name in ("fast", "no-such-model", "slow"):  # its own, a missing one, another tenant's: the same answer
        for pin in (True, False):
            e = _err(r.stub.RepositoryModelLoad, _load(name, pin=pin), metadata=auth(key), timeout=10)
            assert e.code() is C.PERMISSION_DENIED, (name, e.details())
            assert _trailers(e)[REASON] == "permission_denied" and "operator" in e.details()
    r.stub.RepositoryModelLoad(_load("fast"), metadata=auth(key), timeout=30)  # without `pin`: loads
    # nothing pinned on the host
    assert not any(m.pinned for m in isolated.hostd.status().models)


def test_not_found_messages_are_bounded_whatever_name_is_sent(isolated):
    r, h, key = isolated.router, isolated.hostd, isolated.keys["light"]
    for name in ("n" * 100, "n" * 20_000, "bad/\x00name" * 2000):
        e = _err(r.stub.ModelMetadata, pb.ModelMetadataRequest(name=name), metadata=auth(key), timeout=10)
        assert e.code() is C.NOT_FOUND and len(e.details()) < 120, (len(e.details()), e.details()[:200])
        e = _err(r.stub.ModelInfer, pb.ModelInferRequest(model_name=name), metadata=auth(key), timeout=10)
        assert e.code() is C.NOT_FOUND and len(e.details()) < 120
        e = _err(h.stub.ModelMetadata, pb.ModelMetadataRequest(name=name), metadata=((TENANT_HEADER, "light"),),
                 timeout=10)
        assert e.code() is C.NOT_FOUND and len(e.details()) <= 1024, len(e.details())
        assert _trailers(e)[REQUEST_ID]


def test_a_load_failure_names_no_store_path_and_carries_a_request_id(isolated, tmp_path):
    store = isolated.store
    repo = ModelRepository(LocalStorage(store))
    build_onnx_mlp(tmp_path / "b.onnx", (4, 8, 2))
    m = publish_version(repo, onnx_manifest("light", "broken", "1", tmp_path / "b.onnx", "model.onnx"),
                        {"model.onnx": tmp_path / "b.onnx"})
    (store / ModelRepository.file_key(m, "model.onnx")).unlink()  # the manifest names a file that is gone
    x = fast_request()
    x.model_name = "broken"
    x.inputs[0].shape[:] = [1, 4]
    x.raw_input_contents[0] = b"\0" * 16
    e = _err(isolated.router.stub.ModelInfer, x, metadata=auth(isolated.keys["light"]), timeout=30)
    text, rid = e.details(), _trailers(e).get(REQUEST_ID, "")
    assert e.code() is C.UNAVAILABLE, text
    assert str(store) not in text and str(isolated.workdir) not in text and "/" + store.name not in text, text
    assert rid and f"request id {rid}" in text, (rid, text)
    assert rid in isolated.hostd.log() and str(store) in isolated.hostd.log()  # the operator finds the details


def test_a_router_without_a_catalog_does_not_unload_unknown_names(isolated):
    r = RouterProc(isolated.workdir, ["--hosts", isolated.hostd.addr, "--tenants", str(isolated.tenants_file),
                                      "--refresh-interval", "0.2"])
    try:
        key = isolated.keys["light"]
        e = _err(r.stub.RepositoryModelUnload, pb.RepositoryModelUnloadRequest(model_name="never-heard-of-it"),
                 metadata=auth(key), timeout=10)
        assert e.code() is C.NOT_FOUND, e.details()
        e = _err(r.stub.RepositoryModelUnload, pb.RepositoryModelUnloadRequest(model_name="slow"),  # another tenant's
                 metadata=auth(key), timeout=10)
        assert e.code() is C.NOT_FOUND, e.details()
        r.stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name="fast"), metadata=auth(key), timeout=10)
    finally:
        r.stop()
