"""The Prometheus port of hostd and the router: `/metrics` (and `/metrics/`) only; every other path is 404, so
an HTTP health check pointed at the metrics port by mistake (`/v2/health/ready`) fails instead of passing.

One small threaded HTTP server per process, started by the composition root (`serve_metrics`) and stopped
by it (`MetricsServer.close`); scrapes run in its own threads, off the asyncio event loop. A port in use
raises OSError (EADDRINUSE) from `serve_metrics`, before anything else starts. A connection that sends no
request within READ_S (or goes quiet in the middle of one) is closed: http.server waits forever by default,
so each silent connection (a TCP probe, a stuck scraper, a slowloris) held a thread for good."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.exposition import choose_encoder

PATHS = ("/metrics", "/metrics/")
READ_S = 10.0  # a connection's socket timeout: a scrape's request arrives at once, Prometheus's timeout is 10 s


def _handler(registry: CollectorRegistry, read_s: float) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = read_s  # StreamRequestHandler sets it on the socket: a silent connection ends in TimeoutError

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            path = self.path.split("?", 1)[0]
            if path not in PATHS:
                self._send(404, "text/plain; charset=utf-8", b"not found: this port serves /metrics only\n")
                return
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            self._send(200, content_type, encoder(registry))

        def do_HEAD(self) -> None:  # noqa: N802
            self.do_GET()

        def _send(self, code: int, content_type: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def log_message(self, format: str, *args) -> None:  # noqa: A002 - scrapes are not logged
            pass

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True  # restart past TIME_WAIT; on Linux a live listener still makes bind fail


class MetricsServer:
    def __init__(self, server: ThreadingHTTPServer, thread: threading.Thread) -> None:
        self._server, self._thread = server, thread

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def serve_metrics(host: str, port: int, registry: CollectorRegistry, read_s: float = READ_S) -> MetricsServer:
    """Start serving `registry` on http://host:port/metrics (port 0 = any free port, see `.port`)."""
    try:
        server = _Server((host, port), _handler(registry, read_s))
    except OSError as e:  # name the address: "[Errno 98] Address already in use: 'metrics 127.0.0.1:9101'"
        raise OSError(e.errno, e.strerror, f"metrics {host}:{port}") from None
    thread = threading.Thread(target=server.serve_forever, name=f"metrics-http-{port}", daemon=True)
    thread.start()
    return MetricsServer(server, thread)


def register_process_collectors(registry: CollectorRegistry) -> None:
    """The standard process_* (resident memory, CPU, open files; Linux) and python_* (GC, version) series,
    on a process's own registry (prometheus_client puts them on its global one only)."""
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
