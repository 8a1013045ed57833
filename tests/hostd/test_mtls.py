"""A hostd with mutual TLS (certificates from `mmhost certs init`), as a real process: every RPC of the
inference service and HostdControl.Status is refused to a caller without the router's certificate (plaintext,
TLS without a client certificate, a tenant's certificate from the same CA) and served to one with it; a call
without mmhost-tenant is refused unless dev mode is on; the plaintext health port answers kubelet; a hostd
with neither certificates nor plaintext=true refuses to start, and so does one with TLS but no client CA."""

from __future__ import annotations

import os
import subprocess
import sys

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ground import tls
from ground.wire import TENANT_HEADER
from protos import grpc_service_pb2 as pb
from protos import grpc_service_pb2_grpc, hostd_control_pb2, hostd_control_pb2_grpc
from tests.hostd.test_server import infer_req
from tests.hostd_proc import HostdProc
from tests.pki import make_pki
from tests.servers import REPO, free_port

C = grpc.StatusCode
TENANT = (TENANT_HEADER, "demo")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def router_creds(pki) -> grpc.ChannelCredentials:
    return tls.channel_credentials(pki / "ca.pem", pki / "router-client.pem", pki / "router-client-key.pem")


def mtls_env(pki, health_port: int) -> dict[str, str]:
    return {"MMHOST_HOSTD_PLAINTEXT": "false", "MMHOST_HOSTD_DEV_MODE": "false",
            "MMHOST_HOSTD_TLS_CERT": str(pki / "hostd.pem"), "MMHOST_HOSTD_TLS_KEY": str(pki / "hostd-key.pem"),
            "MMHOST_HOSTD_TLS_CLIENT_CA": str(pki / "ca.pem"), "MMHOST_HOSTD_HEALTH_PORT": str(health_port)}


@pytest.fixture(scope="module")
def mtls_hostd(demo_store, pki, tmp_path_factory):
    hp = free_port()
    h = HostdProc(str(demo_store), tmp_path_factory.mktemp("mtls-hostd"), env=mtls_env(pki, hp), health_port=hp,
                  channel_credentials=router_creds(pki), channel_options=tls.target_name_options())
    yield h
    h.stop()


# Every RPC a hostd serves, with a request that succeeds for tenant "demo".
RPCS = {
    "ServerLive": pb.ServerLiveRequest(),
    "ServerReady": pb.ServerReadyRequest(),
    "ServerMetadata": pb.ServerMetadataRequest(),
    "ModelReady": pb.ModelReadyRequest(name="mlp"),
    "ModelMetadata": pb.ModelMetadataRequest(name="mlp"),
    "ModelConfig": pb.ModelConfigRequest(name="mlp"),
    "ModelInfer": infer_req(),
    "ModelStreamInfer": infer_req(),  # a stream of this one request
    "ModelStatistics": pb.ModelStatisticsRequest(name=""),
    "RepositoryIndex": pb.RepositoryIndexRequest(),
    "RepositoryModelLoad": pb.RepositoryModelLoadRequest(model_name="mlp_nobatch"),
    "RepositoryModelUnload": pb.RepositoryModelUnloadRequest(model_name="mlp_nobatch"),
    "Status": hostd_control_pb2.StatusRequest(),
}
assert set(RPCS) - {"Status"} == set(pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods_by_name)


def call(channel: grpc.Channel, rpc: str, metadata=(TENANT,), timeout: float = 30):
    if rpc == "Status":
        return hostd_control_pb2_grpc.HostdControlStub(channel).Status(RPCS[rpc], metadata=metadata, timeout=timeout)
    if rpc == "ModelStreamInfer":
        return list(grpc_service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(
            iter([RPCS[rpc]]), metadata=metadata, timeout=timeout))
    return getattr(grpc_service_pb2_grpc.GRPCInferenceServiceStub(channel), rpc)(RPCS[rpc], metadata=metadata,
                                                                                 timeout=timeout)


def code_of(fn) -> tuple[grpc.StatusCode, str]:
    try:
        fn()
    except grpc.RpcError as e:
        return e.code(), e.details() or ""
    return C.OK, ""


OPTS = [("grpc.use_local_subchannel_pool", 1), *tls.target_name_options()]


def channel(h: HostdProc, creds: grpc.ChannelCredentials | None) -> grpc.Channel:
    return (grpc.secure_channel(h.addr, creds, options=OPTS) if creds is not None
            else grpc.insecure_channel(h.addr, options=OPTS))


@pytest.mark.parametrize("caller", ["plaintext", "tls-without-certificate", "tenant-certificate"])
@pytest.mark.parametrize("rpc", list(RPCS))
def test_a_caller_without_the_router_certificate_is_refused(mtls_hostd, pki, rpc, caller):
    creds = {"plaintext": None,
             "tls-without-certificate": tls.channel_credentials(pki / "ca.pem"),
             "tenant-certificate": tls.channel_credentials(pki / "ca.pem", pki / "tenant-demo.pem",
                                                           pki / "tenant-demo-key.pem")}[caller]
    with channel(mtls_hostd, creds) as ch:
        code, details = code_of(lambda: call(ch, rpc, timeout=5))
    if caller == "tenant-certificate":  # the handshake passes (same CA); the identity check refuses
        assert code is C.UNAUTHENTICATED and "certificate" in details
    else:  # the handshake fails: no certificate, or no TLS at all
        assert code is C.UNAVAILABLE


@pytest.mark.parametrize("rpc", list(RPCS))
def test_the_router_certificate_is_served(mtls_hostd, rpc):
    out = call(mtls_hostd.channel, rpc)
    if rpc == "ModelInfer":
        assert out.model_name == "mlp" and list(out.outputs[0].shape) == [2, 10]
    if rpc == "ModelStreamInfer":
        assert len(out) == 1 and not out[0].error_message and list(out[0].infer_response.outputs[0].shape) == [2, 10]
    if rpc == "Status":
        assert out.host_id


def test_no_tenant_is_refused_without_dev_mode(mtls_hostd):
    for rpc in ("ModelMetadata", "ModelInfer", "ModelStreamInfer", "RepositoryIndex"):
        code, details = code_of(lambda rpc=rpc: call(mtls_hostd.channel, rpc, metadata=()))
        assert code is C.UNAUTHENTICATED and "no tenant" in details
    # server-wide RPCs name no tenant
    assert call(mtls_hostd.channel, "ServerLive", metadata=()).live


def test_dev_mode_uses_the_default_tenant(hostd):
    # the shared hostd (tests/hostd/conftest.py) runs plaintext in dev mode, default tenant "demo"
    assert hostd.stub.ModelMetadata(pb.ModelMetadataRequest(name="mlp"), timeout=30).name == "mlp"
    assert hostd.stub.ModelInfer(infer_req(), timeout=30).outputs


def test_health_needs_the_router_certificate_on_the_main_port_and_not_on_the_health_port(mtls_hostd, pki):
    req = health_pb2.HealthCheckRequest()
    with grpc.insecure_channel(mtls_hostd.health_addr) as ch:
        assert health_pb2_grpc.HealthStub(ch).Check(req, timeout=5).status == health_pb2.HealthCheckResponse.SERVING
    assert health_pb2_grpc.HealthStub(mtls_hostd.channel).Check(req, timeout=5).status == \
        health_pb2.HealthCheckResponse.SERVING
    tenant = tls.channel_credentials(pki / "ca.pem", pki / "tenant-demo.pem", pki / "tenant-demo-key.pem")
    with channel(mtls_hostd, tenant) as ch:
        assert code_of(lambda: health_pb2_grpc.HealthStub(ch).Check(req, timeout=5))[0] is C.UNAUTHENTICATED
    with channel(mtls_hostd, None) as ch:
        assert code_of(lambda: health_pb2_grpc.HealthStub(ch).Check(req, timeout=5))[0] is C.UNAVAILABLE


@pytest.mark.parametrize(("tls_files", "words"), [
    ({}, ("tls_cert", "plaintext")),
    # a hostd with a serving certificate but no tls_client_ca would take mmhost-tenant from any TLS caller:
    # it does not start unless told that only routers can reach it (or in dev mode)
    ({"MMHOST_HOSTD_TLS_CERT": "hostd.pem", "MMHOST_HOSTD_TLS_KEY": "hostd-key.pem"},
     ("tls_client_ca", "tls_without_client_auth")),
], ids=["no-certs", "tls-without-client-ca"])
def test_an_unsafe_configuration_refuses_to_start(tls_files, words, demo_store, pki, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MMHOST_")}
    env.update({k: str(pki / name) for k, name in tls_files.items()})
    p = subprocess.run([sys.executable, "-m", "mmhost.cli", "hostd", "--listen", f"127.0.0.1:{free_port()}",
                        "--store", str(demo_store), "--metrics-port", "0", "--cache-dir", str(tmp_path / "c")],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    last = p.stderr.strip().splitlines()[-1]
    assert all(w in last for w in words), p.stderr
