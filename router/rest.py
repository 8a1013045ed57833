"""KServe v2 REST (the Open Inference Protocol's HTTP/JSON binding, with Triton's binary tensor, statistics,
model configuration and model repository extensions) on the router: one more thin adapter over the SAME
RouterServicer methods gRPC calls. Each route turns HTTP/JSON into the v2 request message (router/rest_codec.py),
calls e.g. `servicer.ModelInfer(bytes, context)` with a RestContext (the `Authorization` header as gRPC's
`authorization` metadata), and turns the answer back into JSON (and binary outputs when asked). So REST calls
get the same authentication, catalog check, byte budget, admission, placement, shedding, access log and
metrics as gRPC ones, on the router's own event loop.

Authentication: every route but /v2/health/live and /v2/health/ready needs `Authorization: Bearer <key>`; a
POST is authenticated before its body is read. The health routes answer load balancers, which carry no key:
live is 200 while the process serves, ready is 200 while some host is up to route to (400 otherwise, and while
the router drains), as the v2 spec's "4xx is false". gRPC's ServerLive/ServerReady still need a key.

Errors are `{"error": "<message>"}` with the status below, the `mmhost-reason` and `mmhost-request-id`
headers, and for sheds `Retry-After` (whole seconds, rounded up) plus `retry-after-ms` (exact): the message,
reason and hint the gRPC status and trailers carry (ground/interceptors.py `status_of`).

Routes (version parts optional): GET /v2/health/live, /v2/health/ready, /v2, /v2/models/{m}[/versions/{v}],
.../ready, .../config, .../stats, /v2/models/stats; POST .../infer, /v2/repository/index,
/v2/repository/models/{m}/load, /v2/repository/models/{m}/unload."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import ssl
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
from aiohttp import web
from google.protobuf.message import Message

from ground.errors import InvalidArgument
from ground.interceptors import status_of
from ground.settings import RouterSettings
from ground.tls import TLSFiles
from ground.wire import RETRY_AFTER
from protos import grpc_service_pb2 as pb
from router import rest_codec as codec
from router.servicer import MAX_CONTROL_BODY, RouterServicer

log = logging.getLogger(__name__)

HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.FAILED_PRECONDITION: 400, grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401, grpc.StatusCode.PERMISSION_DENIED: 403, grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409, grpc.StatusCode.ABORTED: 409, grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.CANCELLED: 499, grpc.StatusCode.UNIMPLEMENTED: 501, grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}  # anything else (INTERNAL, UNKNOWN, DATA_LOSS) is 500
JSON = "application/json"


class RestContext:
    """What RouterServicer reads off a gRPC call, from an HTTP request: the `Authorization` header as the
    `authorization` metadata, no client certificate (REST tenants use API keys), and no deadline of its own
    (the infer `timeout` parameter, in microseconds as on gRPC, and the router's default_timeout_s apply as
    they do to gRPC calls)."""

    def __init__(self, authorization: str | None) -> None:
        self._md: tuple[tuple[str, str], ...] = (("authorization", authorization),) if authorization else ()

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._md

    def time_remaining(self) -> float | None:
        return None

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}


def error_response(err: Exception) -> web.Response:
    """The REST form of what the gRPC interceptor sends for `err`."""
    code, text, md = status_of(err)
    headers = dict(md)
    if RETRY_AFTER in headers:
        headers["Retry-After"] = str(max(0, math.ceil(int(headers[RETRY_AFTER]) / 1000)))
    return web.json_response({"error": text}, status=HTTP_STATUS.get(code, 500), headers=headers)


@web.middleware
async def _errors(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
    try:
        return await handler(request)
    except web.HTTPException as e:  # aiohttp's own: no such route (404), wrong method (405), body too big (413)
        if e.status < 400:
            raise
        headers = {k: v for k, v in e.headers.items() if k.lower() not in ("content-type", "content-length")}
        return web.json_response({"error": e.text or e.reason}, status=e.status, headers=headers)
    except Exception as e:  # noqa: BLE001 - like the gRPC interceptor: every error becomes a status here
        return error_response(e)


class RestApi:
    """The routes, each a conversion around one RouterServicer call."""

    def __init__(self, servicer: RouterServicer, max_body: int) -> None:
        self.servicer = servicer
        self.max_body = max_body
        self.draining = False

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.max_body, middlewares=[_errors])
        get, post = web.get, web.post
        routes = [get("/v2/health/live", self.live), get("/v2/health/ready", self.ready), get("/v2", self.server_metadata),
                  get("/v2/models/stats", self.stats), post("/v2/repository/index", self.index),
                  post("/v2/repository/models/{model}/load", self.load),
                  post("/v2/repository/models/{model}/unload", self.unload)]
        for base in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
            routes += [get(base, self.model_metadata), get(base + "/ready", self.model_ready),
                       get(base + "/config", self.model_config), get(base + "/stats", self.stats),
                       post(base + "/infer", self.infer)]
        app.add_routes(routes)
        return app

    # -- calling the servicer -------------------------------------------------------------------------

    @staticmethod
    def _context(request: web.Request) -> RestContext:
        return RestContext(request.headers.get("Authorization"))

    async def _call(self, method: str, msg: Message, request: web.Request) -> bytes:
        body = msg.SerializeToString()
        if len(body) > MAX_CONTROL_BODY:  # as the gRPC handler's bound (servicer._small)
            raise InvalidArgument(f"{method} request of {len(body)} bytes; at most {MAX_CONTROL_BODY} are accepted")
        return await getattr(self.servicer, method)(body, self._context(request))

    async def _authenticated_body(self, request: web.Request) -> bytearray:
        """The body, read only once the key is known good: a stranger's bytes are never read or parsed.
        ServerLive is the servicer's authentication and nothing else (its unauthenticated count included).
        Read from the stream here rather than with request.read(), which keeps its copy on the request until
        the handler returns: this one is dropped once converted, before the call is forwarded."""
        await self.servicer.ServerLive(b"", self._context(request))
        if request.content_length is not None and request.content_length > self.max_body:
            raise web.HTTPRequestEntityTooLarge(max_size=self.max_body, actual_size=request.content_length)
        body = bytearray()
        async for chunk in request.content.iter_chunked(1 << 20):
            body += chunk
            if len(body) > self.max_body:
                raise web.HTTPRequestEntityTooLarge(max_size=self.max_body, actual_size=len(body))
        return body

    @staticmethod
    def _names(request: web.Request) -> tuple[str, str]:
        return request.match_info.get("model", ""), request.match_info.get("version", "")

    @staticmethod
    def _json(obj) -> web.Response:
        return web.Response(body=codec.dumps(obj), content_type=JSON)

    # -- health: no key ---------------------------------------------------------------------------------

    async def live(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def ready(self, request: web.Request) -> web.Response:
        if self.draining:
            return web.json_response({"error": "the router is shutting down"}, status=400)
        if not self.servicer.cluster.eligible():
            return web.json_response({"error": "no host is up to route to"}, status=400)
        return web.Response(status=200)

    # -- everything else: the servicer's calls ------------------------------------------------------------

    async def server_metadata(self, request: web.Request) -> web.Response:
        out = await self._call("ServerMetadata", pb.ServerMetadataRequest(), request)
        return self._json(codec.message_json(pb.ServerMetadataResponse.FromString(out)))

    async def model_metadata(self, request: web.Request) -> web.Response:
        m, v = self._names(request)
        out = await self._call("ModelMetadata", pb.ModelMetadataRequest(name=m, version=v), request)
        return self._json(codec.message_json(pb.ModelMetadataResponse.FromString(out)))

    async def model_ready(self, request: web.Request) -> web.Response:
        m, v = self._names(request)
        out = await self._call("ModelReady", pb.ModelReadyRequest(name=m, version=v), request)
        if pb.ModelReadyResponse.FromString(out).ready:
            return web.Response(status=200)
        return web.json_response({"error": f"model {m!r} is not ready"}, status=400)

    async def model_config(self, request: web.Request) -> web.Response:
        m, v = self._names(request)
        out = await self._call("ModelConfig", pb.ModelConfigRequest(name=m, version=v), request)
        return self._json(codec.message_json(pb.ModelConfigResponse.FromString(out).config))

    async def stats(self, request: web.Request) -> web.Response:
        m, v = self._names(request)
        out = await self._call("ModelStatistics", pb.ModelStatisticsRequest(name=m, version=v), request)
        return self._json(codec.stats_json(pb.ModelStatisticsResponse.FromString(out)))

    async def infer(self, request: web.Request) -> web.Response:
        m, v = self._names(request)
        body = await self._authenticated_body(request)
        obj, tail = codec.split_body(body, request.headers.get(codec.HEADER_LENGTH))
        req, fmt = codec.infer_request(m, v, obj, tail)
        del body, obj, tail
        data = req.SerializeToString()
        del req  # from here on only the bytes forwarded (and charged to the byte budget) are held
        out = await self.servicer.ModelInfer(data, self._context(request))
        del data
        payload, header_length = codec.infer_response(pb.ModelInferResponse.FromString(out), fmt)
        if header_length is None:
            return web.Response(body=payload, content_type=JSON)
        return web.Response(body=payload, content_type="application/octet-stream",
                            headers={codec.HEADER_LENGTH: str(header_length)})

    async def index(self, request: web.Request) -> web.Response:
        obj = codec.parse_object(bytes(await self._authenticated_body(request)), empty_ok=True)
        out = await self._call("RepositoryIndex", codec.index_request(obj), request)
        return self._json(codec.index_json(pb.RepositoryIndexResponse.FromString(out)))

    async def load(self, request: web.Request) -> web.Response:
        obj = codec.parse_object(bytes(await self._authenticated_body(request)), empty_ok=True)
        await self._call("RepositoryModelLoad", codec.load_request(self._names(request)[0], obj), request)
        return web.Response(status=200)

    async def unload(self, request: web.Request) -> web.Response:
        obj = codec.parse_object(bytes(await self._authenticated_body(request)), empty_ok=True)
        await self._call("RepositoryModelUnload", codec.unload_request(self._names(request)[0], obj), request)
        return web.Response(status=200)


def rest_enabled(listen: str) -> bool:
    return bool(listen) and listen != "0" and not listen.endswith(":0")


def _host_port(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise SystemExit(f"rest_listen must be HOST:PORT, not {listen!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def server_ssl(settings: RouterSettings) -> ssl.SSLContext | None:
    """HTTPS with the router's tenant-facing certificate when it has one (read at start, then kept in step
    with the files by RestServer.refresh_tls); API keys only, client certificates are not asked for on REST."""
    if settings.tls_cert is None or settings.tls_key is None:
        return None
    return _context(settings.tls_cert, settings.tls_key)


def _context(cert_path: str | os.PathLike, key_path: str | os.PathLike) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert_path, key_path)
    return ctx


def _switch_to(current: list[ssl.SSLContext]):
    """An sni_callback for the listener's context: each new handshake, at its ClientHello (with or without a
    server name), continues on current[0], the context of the latest pair. A rotation builds a new context and
    swaps it in there; a context handshakes are using is never changed (load_cert_chain on it would leave
    a window with the new certificate and the old key, and OpenSSL does not let a context in use change)."""
    def callback(sock, _name, ctx):
        if current[0] is not ctx:
            sock.context = current[0]
        return None

    return callback


class RestServer:
    """The REST listener on the running event loop (aiohttp's AppRunner + TCPSite: no thread, no loop of
    its own); the composition root starts and stops it."""

    def __init__(self, servicer: RouterServicer, settings: RouterSettings) -> None:
        self.api = RestApi(servicer, settings.max_message_bytes)
        self.listen = settings.rest_listen
        self.ssl = server_ssl(settings)
        self._current: list[ssl.SSLContext] = [self.ssl] if self.ssl is not None else []
        if self.ssl is not None:
            self.ssl.sni_callback = _switch_to(self._current)
        # the files as the gRPC port follows them (ground/tls.py): a rotated pair reaches REST too
        self._tls_files = TLSFiles(settings.tls_cert, settings.tls_key) \
            if self.ssl is not None and settings.tls_cert is not None and settings.tls_key is not None else None
        self._tls_pending = False
        self.runner: web.AppRunner | None = None
        self.port: int | None = None

    async def start(self) -> int:
        host, port = _host_port(self.listen)
        self.runner = web.AppRunner(self.api.app(), access_log=None, shutdown_timeout=2.0)
        await self.runner.setup()
        site = web.TCPSite(self.runner, host, port, ssl_context=self.ssl)
        try:
            await site.start()
        except OSError as e:
            await self.runner.cleanup()
            raise SystemExit(f"cannot listen on {self.listen} (REST): {e}") from None
        self.port = self.runner.addresses[0][1]
        log.info("KServe v2 REST on %s:%d%s", host, self.port, " (https)" if self.ssl else "")
        return self.port

    async def refresh_tls(self) -> bool:
        """Serve a rotated certificate from the next HTTPS handshake on (connections already open keep their
        session); True when it did. The pair goes into a new SSL context, built off the loop from a private copy
        of what TLSFiles read and checked (the key matches the certificate), never from the live files, and
        handshakes switch to it at their ClientHello (`_switch_to`). A half-written rotation waits for the next
        refresh, as on the gRPC port."""
        files = self._tls_files
        if files is None or self.ssl is None or not (await asyncio.to_thread(files.changed) or self._tls_pending):
            return False
        self._tls_pending = True  # until loaded: a failure (raised, counted by the caller) is tried again
        self._current[0] = await asyncio.to_thread(_new_context, files.material.cert, files.material.key)
        self._tls_pending = False
        log.info("REST: the rotated certificate from %s is served", files.cert_path)
        return True

    async def stop(self) -> None:
        self.api.draining = True
        if self.runner is not None:
            await self.runner.cleanup()


def _new_context(cert: bytes, key: bytes) -> ssl.SSLContext:
    """A server context with this pair, loaded from files only this process can read, removed once loaded
    (`load_cert_chain` takes no bytes)."""
    with tempfile.TemporaryDirectory(prefix="mmhost-rest-tls-") as d:  # 0700
        paths = []
        for name, data in (("cert.pem", cert), ("key.pem", key)):
            path = Path(d) / name
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            paths.append(path)
        return _context(paths[0], paths[1])


__all__ = ["RestApi", "RestContext", "RestServer", "error_response", "rest_enabled"]
