"""ground.tls against a real grpc.aio server on a free port, with certificates from mmhost.certs: TLS with the
CA works and plaintext is refused; mutual TLS refuses a client without a certificate and takes the router's;
the peer check refuses a tenant's certificate from the same CA; certificate files replaced on disk are served
to the next connection without a restart, and a half-written rotation keeps the old pair."""

from __future__ import annotations

import asyncio
import os
import shutil

import grpc
import pytest
from cryptography import x509
from grpc import aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from ground import tls
from mmhost import certs
from tests.pki import served_serial

WHO = "/mmhost.test.Peer/Who"


@pytest.fixture()
def pki(tmp_path):
    """`mmhost certs init` output plus a tenant certificate."""
    certs.init(tmp_path, router_hosts=["127.0.0.1", "localhost"], hostd_hosts=[tls.HOSTD_TLS_NAME], days=2)
    certs.tenant_client(tmp_path, "acme", days=2)
    return tmp_path


async def _who(request: bytes, context) -> bytes:
    peer = tls.peer_identity(context)
    if peer is None:
        return b"-"
    return f"{peer.common_name}|{','.join(peer.sans)}|{peer.tenant or ''}".encode()


async def start(creds, interceptors=()) -> tuple[aio.Server, int]:
    server = aio.server(interceptors=list(interceptors))
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "mmhost.test.Peer", {"Who": grpc.unary_unary_rpc_method_handler(_who)}),))
    port = server.add_secure_port("127.0.0.1:0", creds)
    await server.start()
    return server, port


# A private subchannel pool: every channel makes its own connection (and so its own handshake).
OPTS = [("grpc.use_local_subchannel_pool", 1)]


async def check(port: int, creds=None, options=(), timeout: float = 5.0) -> None:
    """A health check over a new connection; raises AioRpcError when the connection or call fails."""
    opts = OPTS + list(options)
    ch = (aio.secure_channel(f"127.0.0.1:{port}", creds, options=opts) if creds is not None
          else aio.insecure_channel(f"127.0.0.1:{port}", options=opts))
    async with ch:
        await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=timeout)


async def who(port: int, creds, options=()) -> str:
    async with aio.secure_channel(f"127.0.0.1:{port}", creds, options=OPTS + list(options)) as ch:
        return (await ch.unary_unary(WHO)(b"", timeout=5)).decode()


def serial(path) -> int:
    return x509.load_pem_x509_certificate(path.read_bytes()).serial_number


async def _refused(coro) -> grpc.StatusCode:
    try:
        await coro
    except aio.AioRpcError as e:
        return e.code()
    raise AssertionError("the call succeeded")


# ---------------------------------------------------------------------------------------------------------------

def test_tls_with_the_ca_works_and_plaintext_is_refused(pki):
    async def main():
        server, port = await start(tls.server_credentials(pki / "router.pem", pki / "router-key.pem"))
        try:
            await check(port, tls.channel_credentials(pki / "ca.pem"))
            assert await _refused(check(port, None, timeout=2)) == grpc.StatusCode.UNAVAILABLE
            # A client that trusts another CA does not accept the server.
            other = certs.make_ca()
            (pki / "other-ca.pem").write_bytes(certs.cert_pem(other.cert))
            code = await _refused(check(port, tls.channel_credentials(pki / "other-ca.pem"), timeout=2))
            assert code == grpc.StatusCode.UNAVAILABLE
            # No client certificate asked for: the server sees none.
            assert await who(port, tls.channel_credentials(pki / "ca.pem")) == "-"
        finally:
            await server.stop(None)

    asyncio.run(main())


def test_mutual_tls_needs_a_client_certificate_and_reads_its_identity(pki):
    async def main():
        creds = tls.server_credentials(pki / "hostd.pem", pki / "hostd-key.pem", client_ca_path=pki / "ca.pem",
                                       require_client_cert=True)
        server, port = await start(creds)
        name = tls.target_name_options()  # the hostd certificate names mmhost-hostd, not 127.0.0.1
        try:
            router = tls.channel_credentials(pki / "ca.pem", pki / "router-client.pem", pki / "router-client-key.pem")
            await check(port, router, name)
            assert await who(port, router, name) == f"mmhost-router|{tls.ROUTER_IDENTITY}|"
            tenant = tls.channel_credentials(pki / "ca.pem", pki / "tenant-acme.pem", pki / "tenant-acme-key.pem")
            assert await who(port, tenant, name) == "acme|mmhost://tenant/acme|acme"
            no_cert = tls.channel_credentials(pki / "ca.pem")
            assert await _refused(check(port, no_cert, name, timeout=2)) == grpc.StatusCode.UNAVAILABLE
            # Without the name override the dialled address does not match the certificate.
            assert await _refused(check(port, router, timeout=2)) == grpc.StatusCode.UNAVAILABLE
        finally:
            await server.stop(None)

    asyncio.run(main())


def test_peer_check_admits_only_the_router_identity(pki):
    async def main():
        creds = tls.server_credentials(pki / "hostd.pem", pki / "hostd-key.pem", client_ca_path=pki / "ca.pem",
                                       require_client_cert=True)
        gate = tls.PeerCheckInterceptor(tls.require_identity(tls.ROUTER_IDENTITY))
        server, port = await start(creds, [gate])
        name = tls.target_name_options()
        try:
            router = tls.channel_credentials(pki / "ca.pem", pki / "router-client.pem", pki / "router-client-key.pem")
            assert (await who(port, router, name)).startswith("mmhost-router|")
            await check(port, router, name)
            # A tenant's certificate from the same CA passes the handshake but not the check.
            tenant = tls.channel_credentials(pki / "ca.pem", pki / "tenant-acme.pem", pki / "tenant-acme-key.pem")
            assert await _refused(who(port, tenant, name)) == grpc.StatusCode.UNAUTHENTICATED
            assert await _refused(check(port, tenant, name)) == grpc.StatusCode.UNAUTHENTICATED
        finally:
            await server.stop(None)

    asyncio.run(main())


def test_replaced_files_are_served_to_new_connections_without_a_restart(pki):
    async def main():
        cert, key = pki / "router.pem", pki / "router-key.pem"
        server, port = await start(tls.server_credentials(cert, key))
        try:
            first = serial(cert)
            assert await asyncio.to_thread(served_serial, port) == first
            await check(port, tls.channel_credentials(pki / "ca.pem"))

            # A new certificate from a second CA, swapped in the way `mmhost certs` writes files (rename over).
            ca2 = certs.make_ca("second CA")
            (pki / "ca2.pem").write_bytes(certs.cert_pem(ca2.cert))
            new = certs.issue(ca2, "mmhost-router", hosts=["127.0.0.1"], server=True, days=2)
            certs.write_pair(pki, "router", new)
            assert serial(cert) != first

            assert await asyncio.to_thread(served_serial, port) == new.cert.serial_number
            await check(port, tls.channel_credentials(pki / "ca2.pem"))  # trusts only the second CA
            assert await _refused(check(port, tls.channel_credentials(pki / "ca.pem"), timeout=2)) == \
                grpc.StatusCode.UNAVAILABLE
        finally:
            await server.stop(None)

    asyncio.run(main())


def test_a_half_written_rotation_keeps_the_old_pair(pki):
    async def main():
        cert, key = pki / "router.pem", pki / "router-key.pem"
        server, port = await start(tls.server_credentials(cert, key))
        try:
            old = serial(cert)
            # Only the key has been replaced so far: it matches no certificate on disk.
            certs._write(key, certs.key_pem(certs.new_key()), 0o600)
            assert await asyncio.to_thread(served_serial, port) == old
            await check(port, tls.channel_credentials(pki / "ca.pem"))
            # A missing file (between two renames) too.
            os.rename(cert, pki / "aside.pem")
            assert await asyncio.to_thread(served_serial, port) == old
            # Both files agree again: the new pair is taken.
            new = certs.issue(certs.load_ca(pki), "mmhost-router", hosts=["127.0.0.1"], server=True, days=2)
            certs.write_pair(pki, "router", new)
            assert await asyncio.to_thread(served_serial, port) == new.cert.serial_number
            await check(port, tls.channel_credentials(pki / "ca.pem"))
        finally:
            await server.stop(None)

    asyncio.run(main())


def test_client_files_report_a_new_generation_when_they_change(pki):
    files = tls.ClientTLSFiles(pki / "ca.pem", pki / "router-client.pem", pki / "router-client-key.pem")
    c1, g1 = files.credentials()
    assert files.credentials() == (c1, g1)
    shutil.copy(pki / "tenant-acme.pem", pki / "router-client.pem")  # cert without its key: not taken
    assert files.credentials() == (c1, g1)
    shutil.copy(pki / "tenant-acme-key.pem", pki / "router-client-key.pem")
    c2, g2 = files.credentials()
    assert g2 == g1 + 1 and c2 is not c1


def test_server_credentials_refuse_a_mismatched_pair_at_start(pki):
    with pytest.raises(ValueError, match="is not the key"):
        tls.server_credentials(pki / "router.pem", pki / "hostd-key.pem")
    with pytest.raises(ValueError, match="client_ca_path"):
        tls.server_credentials(pki / "router.pem", pki / "router-key.pem", require_client_cert=True)


def test_settings_defaults_name_the_identities_of_ground_tls():
    """ground.settings cannot import ground.tls (grpc) for policy modules' sake: the literals must agree."""
    from ground.settings import HostdSettings, RouterSettings

    assert HostdSettings.model_fields["tls_client_identity"].default == tls.ROUTER_IDENTITY
    assert RouterSettings.model_fields["hostd_tls_name"].default == tls.HOSTD_TLS_NAME
    assert HostdSettings.model_fields["listen"].default.rpartition(":")[2] != "8001", "Triton's port"


def test_settings_decide_tls_or_plaintext(pki):
    from ground.settings import HostdSettings, RouterSettings

    def hostd(**kw):
        base = {"tls_cert": None, "tls_key": None, "tls_client_ca": None, "plaintext": False, "dev_mode": False,
                "tls_without_client_auth": False}
        return HostdSettings(**{**base, **kw})

    pair = {"tls_cert": pki / "hostd.pem", "tls_key": pki / "hostd-key.pem"}
    with pytest.raises(tls.TLSConfigError, match="plaintext=true"):
        tls.hostd_credentials(hostd())  # nothing asked for: no silent plaintext
    assert tls.hostd_credentials(hostd(plaintext=True)) is None and tls.hostd_interceptors(hostd(plaintext=True)) == []
    for bad in ({"plaintext": True, **pair}, {"tls_cert": pair["tls_cert"]},
                {"plaintext": True, "tls_client_ca": pki / "ca.pem"}):
        with pytest.raises(tls.TLSConfigError):
            tls.hostd_credentials(hostd(**bad))
    mutual = hostd(**pair, tls_client_ca=pki / "ca.pem")
    assert tls.hostd_credentials(mutual) is not None and len(tls.hostd_interceptors(mutual)) == 1
    assert tls.hostd_interceptors(hostd(**pair)) == []
    # TLS without client certificates: any TLS caller could name any tenant; only when asked for (or dev mode)
    with pytest.raises(tls.TLSConfigError, match="tls_client_ca"):
        tls.hostd_credentials(hostd(**pair))
    for opt_in in ({"tls_without_client_auth": True}, {"dev_mode": True}):
        assert tls.hostd_credentials(hostd(**pair, **opt_in)) is not None

    def router(**kw):
        base = {"hostd_ca": None, "hostd_client_cert": None, "hostd_client_key": None}
        return RouterSettings(**{**base, **kw})

    assert tls.router_to_hostd(router()) == (None, [])
    with pytest.raises(tls.TLSConfigError, match="mutual TLS"):
        tls.router_to_hostd(router(hostd_ca=pki / "ca.pem"))
    with pytest.raises(tls.TLSConfigError, match="need hostd_ca"):
        tls.router_to_hostd(router(hostd_client_cert=pki / "router-client.pem"))
    files, opts = tls.router_to_hostd(router(hostd_ca=pki / "ca.pem", hostd_client_cert=pki / "router-client.pem",
                                             hostd_client_key=pki / "router-client-key.pem"))
    assert isinstance(files, tls.ClientTLSFiles) and opts == [("grpc.ssl_target_name_override", "mmhost-hostd")]


def test_a_hostd_wired_from_settings_with_a_plaintext_health_port(pki):
    """What the servers will do: hostd's port from its settings (mutual TLS + peer check), the router's dialing
    from its settings, and the kubelet's plaintext health-only port that serves nothing else."""
    from ground.settings import HostdSettings, RouterSettings

    hs = HostdSettings(tls_cert=pki / "hostd.pem", tls_key=pki / "hostd-key.pem", tls_client_ca=pki / "ca.pem",
                       plaintext=False)
    rs = RouterSettings(hostd_ca=pki / "ca.pem", hostd_client_cert=pki / "router-client.pem",
                        hostd_client_key=pki / "router-client-key.pem")

    async def main():
        server = aio.server(interceptors=tls.hostd_interceptors(hs))
        servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "mmhost.test.Peer", {"Who": grpc.unary_unary_rpc_method_handler(_who)}),))
        port = tls.add_port(server, "127.0.0.1:0", tls.hostd_credentials(hs))
        probe, probe_port = tls.health_only_server(servicer, "127.0.0.1", 0)
        await server.start()
        await probe.start()
        try:
            files, opts = tls.router_to_hostd(rs)
            creds, _ = files.credentials()
            assert (await who(port, creds, opts)).startswith("mmhost-router|")
            assert await _refused(check(port, None, timeout=2)) == grpc.StatusCode.UNAVAILABLE
            await check(probe_port, None)  # the kubelet's probe: plaintext, health only
            await servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
            async with aio.insecure_channel(f"127.0.0.1:{probe_port}", options=OPTS) as ch:
                r = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
                assert r.status == health_pb2.HealthCheckResponse.NOT_SERVING  # draining shows on both
                with pytest.raises(aio.AioRpcError) as e:
                    await ch.unary_unary(WHO)(b"", timeout=5)
                assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
        finally:
            await probe.stop(None)
            await server.stop(None)

    asyncio.run(main())


def test_peer_check_covers_streaming_methods(pki):
    async def stream(request: bytes, context):
        for i in range(3):
            yield bytes([i])

    async def main():
        creds = tls.server_credentials(pki / "hostd.pem", pki / "hostd-key.pem", client_ca_path=pki / "ca.pem",
                                       require_client_cert=True)
        server = aio.server(interceptors=[tls.PeerCheckInterceptor(tls.require_identity(tls.ROUTER_IDENTITY))])
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "mmhost.test.Peer", {"Stream": grpc.unary_stream_rpc_method_handler(stream)}),))
        port = server.add_secure_port("127.0.0.1:0", creds)
        await server.start()
        name = tls.target_name_options()
        try:
            for stem, ok in (("router-client", True), ("tenant-acme", False)):
                c = tls.channel_credentials(pki / "ca.pem", pki / f"{stem}.pem", pki / f"{stem}-key.pem")
                async with aio.secure_channel(f"127.0.0.1:{port}", c, options=OPTS + name) as ch:
                    call = ch.unary_stream("/mmhost.test.Peer/Stream")(b"", timeout=5)
                    if ok:
                        assert [r async for r in call] == [b"\x00", b"\x01", b"\x02"]
                    else:
                        with pytest.raises(aio.AioRpcError) as e:
                            _ = [r async for r in call]
                        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        finally:
            await server.stop(None)

    asyncio.run(main())
