"""The data link with mutual TLS (ground/link_tls.py), against a real hostd process serving mTLS: the hostd
advertises its data port, a router's Forwarder with the router's client certificate answers calls on TLS links
as on unary calls, a link ends its calls cleanly (END: TLS has no half-close), and whoever is not a router (a
tenant's certificate from the same CA, no certificate, plaintext) is closed with nothing read or answered while
the hostd serves on."""

from __future__ import annotations

import asyncio
import socket
import ssl

import numpy as np
import pytest

from ground import link_tls, tls
from ground.framelink import MAGIC, read_message, write_message
from ground.wire import TENANT_HEADER
from mmhost.demo_models import seed_store
from protos import grpc_service_pb2 as pb
from protos import hostd_data_pb2 as hd
from router.forward import Forwarder
from tests.hostd.test_mtls import mtls_env, router_creds
from tests.hostd_proc import HostdProc
from tests.pki import make_pki
from tests.servers import free_port

DIM = 64
MD = ((TENANT_HEADER, "demo"),)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def host(pki, tmp_path_factory):
    store = tmp_path_factory.mktemp("store")
    seed_store(store)
    hp = free_port()
    h = HostdProc(str(store), tmp_path_factory.mktemp("link-tls-hostd"), env=mtls_env(pki, hp),
                  health_port=hp, channel_credentials=router_creds(pki), channel_options=tls.target_name_options(),
                  args=["--preload"])
    yield h
    h.stop()


def _files(pki) -> tls.ClientTLSFiles:
    return tls.ClientTLSFiles(pki / "ca.pem", pki / "router-client.pem", pki / "router-client-key.pem")


def _forwarder(pki, host, **kw) -> Forwarder:
    f = Forwarder(64 << 20, _files(pki), tls.target_name_options(), streams=2, stream_max_body_bytes=1 << 20, **kw)
    f.set_data_ports({host.addr: host.status().data_port})
    return f


def _body(seed: int) -> bytes:
    x = np.random.default_rng(seed).random((1, DIM), dtype=np.float32)
    return pb.ModelInferRequest(model_name="mlp", raw_input_contents=[x.tobytes()], inputs=[
        pb.ModelInferRequest.InferInputTensor(name="input", datatype="FP32", shape=[1, DIM])]).SerializeToString()


def _out(resp: bytes) -> np.ndarray:
    return np.frombuffer(pb.ModelInferResponse.FromString(resp).raw_output_contents[0], np.float32)


def _links(f: Forwarder) -> int:
    return sum(st.link for p in f._streams._pools.values() for st in p.streams)


def test_an_mtls_hostd_advertises_its_data_port(host):
    assert host.status().data_port > 0


def test_calls_on_tls_links_answer_as_unary_calls_and_end_cleanly(pki, host):
    ends: list[str] = []

    async def go():
        linked, unary = _forwarder(pki, host, on_stream_end=ends.append), Forwarder(
            64 << 20, _files(pki), tls.target_name_options())
        try:
            got = await asyncio.gather(*(linked.unary(host.addr, "ModelInfer", _body(i), timeout=30, metadata=MD)
                                         for i in range(8)))
            want = [await unary.unary(host.addr, "ModelInfer", _body(i), timeout=30, metadata=MD) for i in range(8)]
            return got, want, _links(linked)
        finally:
            await linked.close()  # sends END on each link: the host answers what is out and closes
            await unary.close()

    got, want, links = asyncio.run(go())
    assert links == 2  # 8 calls out on 2 streams, both on TLS links
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(_out(g), _out(w), rtol=1e-4, atol=1e-5)
    assert ends == []  # closed by the router: no stream broke


def _client_context(pki, cert: str | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    if cert is not None:
        ctx.load_cert_chain(pki / f"{cert}.pem", pki / f"{cert}-key.pem")
    return ctx


def _one_call_bytes() -> bytes:
    call = hd.ForwardedCall(seq=1, tenant="demo", timeout_us=10_000_000, request=_body(0))
    return hd.ForwardedCalls(calls=[call]).SerializeToString()


async def _try_link(port: int, ctx: ssl.SSLContext | None) -> bytes | None:
    """Open a link (with `ctx`, or plaintext), send one call, and return the hostd's first message: None when
    the hostd closed the connection without answering."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(
            "127.0.0.1", port, ssl=ctx, server_hostname=tls.HOSTD_TLS_NAME if ctx else None), 10)
    except (ssl.SSLError, ConnectionError):
        return None  # refused in the handshake (TLS 1.3 may instead report it at the first read)
    try:
        writer.write(MAGIC)
        write_message(writer, _one_call_bytes())
        await writer.drain()
        return await asyncio.wait_for(read_message(reader, 64 << 20), 10)
    except (ssl.SSLError, ConnectionError, asyncio.IncompleteReadError):
        return None
    finally:
        writer.close()


def test_the_router_certificate_gets_an_answer_on_a_hand_made_link(pki, host):
    """The yardstick for the refusals below: the same bytes with the router's certificate are answered."""
    got = asyncio.run(_try_link(host.status().data_port, _client_context(pki, "router-client")))
    assert got is not None
    answers = hd.ForwardedAnswers.FromString(got).answers
    assert [a.seq for a in answers] == [1] and pb.ModelInferResponse.FromString(answers[0].response).outputs


@pytest.mark.parametrize("who", ["tenant-demo", "no certificate", "plaintext"])
def test_whoever_is_not_a_router_is_closed_unanswered_and_the_hostd_serves_on(pki, host, who):
    port = host.status().data_port
    ctx = None if who == "plaintext" else _client_context(pki, None if who == "no certificate" else who)
    assert asyncio.run(_try_link(port, ctx)) is None
    if who == "plaintext":  # the link's bytes are not a TLS handshake: the hostd closes at once, unanswered
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(MAGIC + b"\0" * 64)
            try:
                assert s.recv(100) == b""
            except ConnectionResetError:
                pass

    async def go():
        f = _forwarder(pki, host)
        try:
            return await f.unary(host.addr, "ModelInfer", _body(1), timeout=30, metadata=MD), _links(f)
        finally:
            await f.close()

    resp, links = asyncio.run(go())
    assert pb.ModelInferResponse.FromString(resp).outputs and links == 1


def test_a_router_that_does_not_trust_the_hostd_sends_its_calls_on_grpc_streams(pki, host, tmp_path):
    """A link whose handshake fails on the router's side (here: the hostd's certificate does not carry the name
    the router expects) is a link that cannot be reached: the call goes on a gRPC stream, and the TLS check
    there fails it the same way, so nothing goes out over a link the router could not verify."""
    ends: list[str] = []

    async def go():
        f = Forwarder(64 << 20, _files(pki), tls.target_name_options("someone-else"), streams=1,
                      stream_max_body_bytes=1 << 20, on_stream_end=ends.append, tls_name="someone-else")
        f.set_data_ports({host.addr: host.status().data_port})
        try:
            with pytest.raises(Exception) as e:
                await f.unary(host.addr, "ModelInfer", _body(2), timeout=10, metadata=MD)
            return e.value, _links(f)
        finally:
            await f.close()

    err, links = asyncio.run(go())
    assert links == 0 and "link_unreachable" in ends, (err, ends)


def test_link_server_tls_reads_a_router_identity_from_a_peer_certificate():
    cert = {"subject": ((("commonName", "mmhost-router"),),), "subjectAltName": (("URI", "spiffe://x/router"),
                                                                                   ("DNS", "r.example"))}
    peer = link_tls.peer_of(cert)
    assert peer is not None and peer.common_name == "mmhost-router"
    assert peer.sans == ("spiffe://x/router", "r.example")
    assert link_tls.peer_of(None) is None and link_tls.peer_of({}) is None


def test_a_rotated_hostd_certificate_reaches_new_links_without_a_restart(pki, host):
    """hostd re-reads its serving certificate at the next link's handshake (as its gRPC port does); the new
    link, verified against the CA by the hostd's name, is answered. Last here: it leaves the new pair in place."""
    from mmhost import certs
    from tests.pki import served_serial

    port = host.status().data_port
    old = served_serial(port)
    new = certs.issue(certs.load_ca(pki), tls.HOSTD_TLS_NAME, hosts=[tls.HOSTD_TLS_NAME], uris=[tls.HOSTD_IDENTITY],
                      server=True, days=2)
    certs.write_pair(pki, "hostd", new)
    assert new.cert.serial_number != old and served_serial(port) == new.cert.serial_number
    got = asyncio.run(_try_link(port, _client_context(pki, "router-client")))
    assert got is not None and [a.seq for a in hd.ForwardedAnswers.FromString(got).answers] == [1]
    assert host.proc.poll() is None
