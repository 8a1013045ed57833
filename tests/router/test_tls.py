"""The perimeter end to end, with real processes and certificates from `mmhost certs init`: a router serving
tenants over TLS (API key or tenant client certificate) in front of a hostd with mutual TLS (the router
presents its client certificate and verifies the hostd by name). Triton's gRPC client over TLS; a plaintext
client is refused; the router's serving certificate and its client certificate to hostds rotate without a
restart."""

from __future__ import annotations

import json
import subprocess
import time
import sys

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ground import tls
from mmhost import certs
from mmhost.demo_models import seed_store
from protos import grpc_service_pb2 as pb
from protos import grpc_service_pb2_grpc
from router.tenants import FileTenants
from tests.hostd.test_mtls import mtls_env, router_creds
from tests.hostd.test_server import infer_req
from tests.hostd_proc import HostdProc, metric_value
from tests.router.conftest import auth
from tests.router.router_proc import RouterProc
from tests.router.test_cluster import wait_until
from tests.pki import make_pki, served_serial
from tests.servers import free_port

C = grpc.StatusCode


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    # ghost: a certificate from the CA for a tenant the registry does not know
    return make_pki(tmp_path_factory.mktemp("pki"), ("demo", "ghost"))


def mtls_hostd_and_router_env(pki, work) -> tuple[HostdProc, int, dict[str, str]]:
    """A mutual-TLS hostd on `work`'s store, the router's plaintext health port, and the environment of a TLS
    router that calls it with its client certificate."""
    hp = free_port()
    h = HostdProc(str(work / "store"), work, env=mtls_env(pki, hp), health_port=hp,
                  channel_credentials=router_creds(pki), channel_options=tls.target_name_options())
    rhp = free_port()
    env = {"MMHOST_ROUTER_PLAINTEXT": "false", "MMHOST_ROUTER_TLS_CERT": str(pki / "router.pem"),
           "MMHOST_ROUTER_TLS_KEY": str(pki / "router-key.pem"), "MMHOST_ROUTER_HOSTD_CA": str(pki / "ca.pem"),
           "MMHOST_ROUTER_HOSTD_CLIENT_CERT": str(pki / "router-client.pem"),
           "MMHOST_ROUTER_HOSTD_CLIENT_KEY": str(pki / "router-client-key.pem"),
           "MMHOST_ROUTER_HEALTH_PORT": str(rhp)}
    return h, rhp, env


@pytest.fixture(scope="module")
def perimeter(pki, tmp_path_factory):
    """(router, {tenant: key}): a TLS router (tenant certificates accepted) -> a mutual-TLS hostd."""
    work = tmp_path_factory.mktemp("perimeter")
    store = work / "store"
    seed_store(store)
    # the demo models live in tenant "demo"'s prefix
    tenants = FileTenants(work / "tenants.json")
    keys = {t: tenants.create(t) for t in ("demo", "other")}
    h, rhp, env = mtls_hostd_and_router_env(pki, work)
    env = {**env, "MMHOST_ROUTER_TLS_CLIENT_CA": str(pki / "ca.pem"),
           "MMHOST_ROUTER_TLS_CLIENT_LISTEN": f"127.0.0.1:{free_port()}",
           "MMHOST_ROUTER_UPLOADS": "true"}
    r = RouterProc(work, ["--hosts", h.addr, "--tenants", str(work / "tenants.json"), "--store", str(store),
                          "--refresh-interval", "0.2"], env, health_port=rhp,
                   channel_credentials=tls.channel_credentials(pki / "ca.pem"))
    r.cert_addr = env["MMHOST_ROUTER_TLS_CLIENT_LISTEN"]  # the port that requires tenant certificates
    r.hostd = h
    yield r, keys
    r.stop()
    h.stop()


# Triton's client runs in a subprocess: its protobuf registry and ours cannot share a process.
SCRIPT = r"""
import json, sys
import numpy as np
import tritonclient.grpc as g
addr, pki, demo, other, what, cert_addr = sys.argv[1:7]
ca = f"{pki}/ca.pem"

def client(tenant=None):
    extra = {} if tenant is None else {"private_key": f"{pki}/tenant-{tenant}-key.pem",
                                       "certificate_chain": f"{pki}/tenant-{tenant}.pem"}
    return g.InferenceServerClient(addr if tenant is None else cert_addr, ssl=True, root_certificates=ca,
                                   channel_args=[("grpc.use_local_subchannel_pool", 1)], **extra)

def infer(c, headers=None):
    x = g.InferInput("input", [2, 64], "FP32")
    x.set_data_from_numpy(np.random.default_rng(0).random((2, 64), dtype=np.float32))
    return list(c.infer("mlp", [x], headers=headers, client_timeout=60).as_numpy("output").shape)

def status(fn):
    try:
        return fn()
    except g.InferenceServerException as e:
        return e.status()

key = {"authorization": f"Bearer {demo}"}
out = {}
c = client()
out["key"] = [c.is_server_live(headers=key), c.is_server_ready(headers=key), c.get_server_metadata(headers=key).name,
              c.get_model_metadata("mlp", headers=key).name, infer(c, key)]
out["no_key"] = status(lambda: c.get_model_metadata("mlp"))
if what == "all":
    t = client("demo")
    out["cert"] = [t.get_model_metadata("mlp").name, infer(t), infer(t, key)]
    out["cert_other_key"] = status(lambda: infer(t, {"authorization": f"Bearer {other}"}))
    out["ghost_cert"] = status(lambda: client("ghost").get_model_metadata("mlp").name)
    nocert = g.InferenceServerClient(cert_addr, ssl=True, root_certificates=ca)
    out["cert_port_without_cert"] = status(lambda: nocert.is_server_live(headers=key))
print(json.dumps(out))
"""


def triton(r: RouterProc, pki, keys: dict[str, str], what: str = "all") -> dict:
    p = subprocess.run([sys.executable, "-c", SCRIPT, r.addr, str(pki), keys["demo"], keys["other"], what,
                        r.cert_addr],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_triton_client_over_tls_with_an_api_key_or_a_tenant_certificate(perimeter, pki):
    r, keys = perimeter
    out = triton(r, pki, keys)
    assert out["key"] == [True, True, "mmhost-router", "mlp", [2, 10]]
    assert out["no_key"] == "StatusCode.UNAUTHENTICATED"
    assert out["cert"] == ["mlp", [2, 10], [2, 10]]  # no API key at all; then key and certificate agreeing
    assert out["cert_other_key"] == "StatusCode.UNAUTHENTICATED"  # a key for another tenant with this certificate
    assert out["ghost_cert"] == "StatusCode.UNAUTHENTICATED"  # a certificate for a tenant the registry lacks
    assert out["cert_port_without_cert"] == "StatusCode.UNAVAILABLE"  # that port requires a certificate


def code_of(fn) -> grpc.StatusCode:
    try:
        fn()
    except grpc.RpcError as e:
        return e.code()
    return C.OK


def test_a_plaintext_client_on_the_tls_port_is_refused(perimeter):
    r, keys = perimeter
    with grpc.insecure_channel(r.addr) as ch:
        stub = grpc_service_pb2_grpc.GRPCInferenceServiceStub(ch)
        assert code_of(lambda: stub.ServerLive(pb.ServerLiveRequest(), metadata=auth(keys["demo"]), timeout=5)) \
            is C.UNAVAILABLE


def test_the_health_port_answers_in_plaintext(perimeter):
    r, _ = perimeter
    with grpc.insecure_channel(r.health_addr) as ch:
        assert health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5).status == \
            health_pb2.HealthCheckResponse.SERVING


def test_a_tenant_uploads_over_tls_into_a_local_store(perimeter, pki, tmp_path):
    """`mmhost upload --router --tls-ca` (embedded mode: the store is a folder, the catalog is the store); the
    model is callable through the router at once, and a plaintext upload client is refused."""
    import numpy as np
    from typer.testing import CliRunner

    from mmhost.cli import app
    from mmhost.demo_models import build_onnx_mlp
    from mmhost.upload_client import PublishFailed, RouterTarget, header, publish

    r, keys = perimeter
    build_onnx_mlp(tmp_path / "m.onnx", (8, 4, 2))
    run = CliRunner().invoke(app, ["upload", str(tmp_path / "m.onnx"), "--router", r.addr, "--tls-ca",
                                   str(pki / "ca.pem"), "--api-key", keys["other"], "--model", "over_tls"])
    assert run.exit_code == 0, run.output
    assert run.stdout.strip().splitlines()[-1] == "1"
    req = pb.ModelInferRequest(model_name="over_tls", inputs=[pb.ModelInferRequest.InferInputTensor(
        name="input", datatype="FP32", shape=[1, 8])], raw_input_contents=[np.ones((1, 8), np.float32).tobytes()])
    assert r.stub.ModelInfer(req, metadata=auth(keys["other"]), timeout=60).outputs[0].shape == [1, 2]
    assert code_of(lambda: r.stub.ModelInfer(req, metadata=auth(keys["demo"]), timeout=30)) == C.NOT_FOUND
    with pytest.raises(PublishFailed) as e:
        publish(RouterTarget(r.addr, keys["other"], plaintext=True, timeout_s=10), header(tmp_path / "m.onnx", "x"),
                tmp_path / "m.onnx")
    assert e.value.code == "UNAVAILABLE"


def test_a_rotated_serving_certificate_reaches_new_connections_without_a_restart(perimeter, pki):
    r, keys = perimeter
    new = certs.issue(certs.load_ca(pki), "mmhost-router", hosts=["127.0.0.1", "localhost"], server=True, days=2)
    certs.write_pair(pki, "router", new)
    assert served_serial(r.port) == new.cert.serial_number
    assert triton(r, pki, keys, "key")["key"][-1] == [2, 10]  # a new connection, verified against the CA
    assert r.proc.poll() is None


def test_a_rotated_client_certificate_to_hostds_takes_new_channels(perimeter, pki):
    """The router re-reads its client certificate and dials hostds again with it: swapped for one that does
    not name a router, the hostd refuses the router's calls; swapped back, they pass again, on the hostd's
    data link (mutual TLS) as before the swap."""
    r, keys = perimeter

    def infer() -> grpc.StatusCode:
        return code_of(lambda: r.stub.ModelInfer(infer_req(), metadata=auth(keys["demo"]), timeout=30))

    assert infer() is C.OK
    assert r.hostd.status().data_port > 0 and r.data_links(r.hostd) >= 1, "calls to a mutual-TLS hostd ride its data link"
    # on the router's own event loop (uvloop by default, ground/eventloop.py), with no stream failed or fallen back
    assert metric_value(r.metrics_text(), "mmhost_router_hostd_stream_ends_total") == 0
    good = (pki / "router-client.pem").read_bytes(), (pki / "router-client-key.pem").read_bytes()
    ca = certs.load_ca(pki)
    try:
        certs.write_pair(pki, "router-client", certs.issue(ca, "not-a-router", uris=["mmhost://tenant/x"], client=True,
                                                           days=2))
        wait_until(lambda: infer() is not C.OK, timeout=20, what="calls refused with the wrong certificate")
    finally:  # the way `mmhost certs` writes: key first, then the certificate
        certs._write(pki / "router-client-key.pem", good[1], 0o600)
        certs._write(pki / "router-client.pem", good[0], 0o644)
    wait_until(lambda: infer() is C.OK, timeout=30, what="calls served after the swap back")
    # a link refused by hostd sends that host's calls on gRPC streams for up to a minute (LINK_RETRY_S)
    wait_until(lambda: infer() is C.OK and r.data_links(r.hostd) >= 1, timeout=90, what="calls back on the data link")


def test_no_certificates_and_no_plaintext_refuses_to_start(tmp_path):
    import os

    from tests.servers import REPO

    FileTenants(tmp_path / "tenants.json").create("demo")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MMHOST_")}
    p = subprocess.run([sys.executable, "-m", "mmhost.cli", "router", "--listen", f"127.0.0.1:{free_port()}",
                        "--hosts", "127.0.0.1:1", "--tenants", str(tmp_path / "tenants.json"), "--metrics-port", "0"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    last = p.stderr.strip().splitlines()[-1]
    assert "tls_cert" in last and "plaintext" in last, p.stderr


def test_without_a_second_port_the_tenant_port_requires_a_certificate(pki):
    """tls_client_ca without tls_client_listen: gRPC cannot ask for an optional client certificate, so the one
    tenant port requires it."""
    import asyncio

    from grpc import aio
    from grpc_health.v1 import health

    from ground.settings import RouterSettings

    s = RouterSettings(tls_cert=pki / "router.pem", tls_key=pki / "router-key.pem", tls_client_ca=pki / "ca.pem")

    async def main():
        server = aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
        port = tls.add_port(server, "127.0.0.1:0", tls.router_credentials(s))
        await server.start()
        try:
            async def check(creds):
                async with aio.secure_channel(f"127.0.0.1:{port}", creds,
                                              options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
                    await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)

            await check(tls.channel_credentials(pki / "ca.pem", pki / "tenant-demo.pem", pki / "tenant-demo-key.pem"))
            with pytest.raises(aio.AioRpcError) as e:
                await check(tls.channel_credentials(pki / "ca.pem"))
            assert e.value.code() is C.UNAVAILABLE
        finally:
            await server.stop(None)

    asyncio.run(main())
    assert tls.router_client_cert_credentials(s) is None


def tls_router(pki, work, *args: str, env: dict[str, str] | None = None) -> tuple[HostdProc, RouterProc, dict[str, str]]:
    """(hostd, router, {tenant: key}): a TLS router (refreshing every 0.2 s, `args` and `env` added) in front of a
    mutual-TLS hostd, on a store in `work` with the demo models and tenant demo."""
    store = work / "store"
    seed_store(store)
    keys = {"demo": FileTenants(work / "tenants.json").create("demo")}
    h, rhp, base = mtls_hostd_and_router_env(pki, work)
    r = RouterProc(work, ["--hosts", h.addr, "--tenants", str(work / "tenants.json"), "--store", str(store),
                          "--refresh-interval", "0.2", *args], {**base, **(env or {})}, health_port=rhp,
                   channel_credentials=tls.channel_credentials(pki / "ca.pem"))
    return h, r, keys


def served_fast(r: RouterProc, key: str) -> bool:
    """One call answered, and counted on the fast lane within 0.5 s (HAProxy's log line read back)."""
    from tests.hostd_proc import metric_value

    def fast() -> float:
        return metric_value(r.metrics_text(), "mmhost_router_fast_lane_requests_total")

    n = fast()
    assert r.stub.ModelInfer(infer_req("mlp"), metadata=auth(key), timeout=30).outputs[0].name
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        if fast() > n:
            return True
        time.sleep(0.05)
    return False


def test_the_fast_lane_serves_over_tls_with_mutual_tls_to_hostds(pki, tmp_path):
    """fast_lane=haproxy in the perimeter: HAProxy terminates the tenants' TLS on listen and calls the hostd with
    the router's client certificate (mutual TLS), verifying the hostd by its TLS name; the call is served fast."""
    h, r, keys = tls_router(pki, tmp_path, env={"MMHOST_ROUTER_FAST_LANE": "haproxy"})
    try:
        wait_until(lambda: served_fast(r, keys["demo"]), timeout=20, what="a call over TLS on the fast lane")
        plain = grpc_service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(r.addr))
        md = auth(keys["demo"])
        assert code_of(lambda: plain.ModelInfer(infer_req("mlp"), metadata=md, timeout=5)) is C.UNAVAILABLE
    finally:
        r.stop()
        h.stop()


def _haproxy_holds(router_pid: int, pem_name: str) -> int:
    """The serial (an int) of the certificate HAProxy's runtime API says it holds in `pem_name`, a file of the
    fast lane's private directory (found from HAProxy's own command line, a child of the router)."""
    from pathlib import Path

    import psutil

    from tests.servers import haproxy_ask

    (child,) = psutil.Process(router_pid).children()
    cfg = Path(child.cmdline()[child.cmdline().index("-f") + 1])
    out = haproxy_ask(cfg.parent / "admin.sock", f"show ssl cert {cfg.parent / pem_name}")
    serial = next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Serial:")), None)
    if serial is None:  # "operations on certificates are currently locked": a commit is under way; ask again
        return -1
    return int(serial, 16)


def test_rotated_certificates_reach_the_fast_lane_without_a_restart(tmp_path):
    """fast_lane=haproxy with TLS both ways: a new tenant-facing certificate is what HAProxy presents to the next
    connection, and a new client certificate to hostds is the one HAProxy holds, at the router's next refreshes,
    with the same HAProxy process (no restart) serving fast calls throughout. Without the runtime API's
    set/commit ssl cert the old certificates stayed until the router restarted."""
    from tests.hostd_proc import metric_value

    pki = make_pki(tmp_path / "pki")  # its own: this test rotates the router's certificates
    h, r, keys = tls_router(pki, tmp_path, env={"MMHOST_ROUTER_FAST_LANE": "haproxy"})
    try:
        wait_until(lambda: served_fast(r, keys["demo"]), timeout=20, what="a call over TLS on the fast lane")
        import psutil

        haproxy = psutil.Process(r.proc.pid).children()[0].pid
        ca = certs.load_ca(pki)
        new = certs.issue(ca, "mmhost-router", hosts=["127.0.0.1", "localhost"], server=True, days=2)
        assert served_serial(r.port) != new.cert.serial_number
        certs.write_pair(pki, "router", new)
        wait_until(lambda: served_serial(r.port) == new.cert.serial_number, timeout=20,
                   what="HAProxy presenting the rotated serving certificate")
        client = certs.issue(ca, "mmhost-router", uris=[tls.ROUTER_IDENTITY], client=True, days=2)
        assert _haproxy_holds(r.proc.pid, "hostd-client.pem") != client.cert.serial_number
        certs.write_pair(pki, "router-client", client)
        wait_until(lambda: _haproxy_holds(r.proc.pid, "hostd-client.pem") == client.cert.serial_number,
                   timeout=20, what="HAProxy holding the rotated client certificate")
        wait_until(lambda: served_fast(r, keys["demo"]), timeout=20, what="fast calls after both rotations")
        # counted when the refresh that sent them ends (after its checks of the other watched files), a moment
        # after HAProxy holds them: once, a scrape right after the check above read 1
        wait_until(lambda: metric_value(r.metrics_text(), "mmhost_router_fast_lane_tls_reloads_total",
                                        outcome="ok") >= 2, timeout=10, what="both rotations counted")
        assert metric_value(r.metrics_text(), "mmhost_router_fast_lane_restarts_total") == 0
        assert psutil.Process(r.proc.pid).children()[0].pid == haproxy
    finally:
        r.stop()
        h.stop()


def test_a_rotated_certificate_reaches_the_rest_port_without_a_restart(tmp_path):
    """REST (rest_listen) over HTTPS with the router's tenant-facing certificate: a rotated pair is what the next
    HTTPS connection gets, verified against the CA, and a half-written rotation (the new key beside the old
    certificate) keeps the old pair serving meanwhile. Before, REST read its certificate once, at start."""
    import ssl
    import urllib.request

    pki = make_pki(tmp_path / "pki")  # its own: this test rotates the router's certificate
    rest = free_port()
    h, r, _ = tls_router(pki, tmp_path, "--rest-listen", f"127.0.0.1:{rest}")
    try:
        trust = ssl.create_default_context(cafile=str(pki / "ca.pem"))

        def live() -> int:
            with urllib.request.urlopen(f"https://127.0.0.1:{rest}/v2/health/live", context=trust, timeout=5) as resp:
                return resp.status

        assert live() == 200
        first = served_serial(rest)
        new = certs.issue(certs.load_ca(pki), "mmhost-router", hosts=["127.0.0.1", "localhost"], server=True, days=2)
        certs._write(pki / "router-key.pem", certs.key_pem(new.key), 0o600)  # half-way: the key alone
        # the REST refresh read the half-written pair and kept the old one (ground/tls.py logs it)
        wait_until(lambda: "cannot be used yet" in r.log_path.read_text(errors="replace"), timeout=20,
                   what="the refresh seeing the half-written rotation")
        assert served_serial(rest) == first and live() == 200
        certs._write(pki / "router.pem", certs.cert_pem(new.cert), 0o644)
        wait_until(lambda: served_serial(rest) == new.cert.serial_number, timeout=20,
                   what="REST presenting the rotated certificate")
        assert live() == 200  # verified against the CA, with the new certificate
        assert r.proc.poll() is None
    finally:
        r.stop()
        h.stop()
