"""The fast lane's pure part: HAProxy's configuration, the maps it routes by, and its log lines read back.

The fast lane (router/fastlane.py) puts HAProxy, a C proxy, in front of the router on the tenants' address.
It serves one case, the common one, with no Python per request: a ModelInfer whose API key belongs to a
tenant with no per-request quota, for a model version READY on an up host, with a body that fits HAProxy's
buffer. Everything else (every other RPC, an unknown key, a cold, unknown or other tenant's model, a limited
tenant, a large body, a key sent in an unusual form) goes to the Python router unchanged, which answers it
exactly as without the fast lane. The router decides what the fast lane may serve and says it in two maps:

- keys:   sha256(API key) -> tenant, for the tenants without rate or concurrency limits;
- routes: "tenant/model/version" ("tenant/model/" for the latest) -> the server name of one up host where that
          version (any version, for the latest) is READY.

HAProxy reads the key from `authorization: Bearer <key>`, hashes it (sha2), finds the tenant, reads
model_name and model_version from the gRPC body (ungrpc: fields 1 and 2; it fails on a message that is not
whole in the buffer, so large bodies take the Python lane), and looks the route up. On a hit it forwards the
request to that host with `mmhost-tenant` set (any copy the caller sent is removed) and `mmhost-lane: fast`,
which makes hostd leave out its `mmhost-served` trailer on an OK answer (HAProxy has no fetch for trailers,
and would pass it on to the tenant); a refusal is a trailers-only answer, whose `mmhost-served` HAProxy logs
from the headers and removes. An OK fast-lane access log line takes its version from the route (the
highest READY version on the host, for the latest) and its stored size from the hostds' trailers the access
log has written (none when it has seen none: the replay's --sizes-from fills it from the store), and has no
load, queue or compute time (hostd's histograms have them). A host whose server is down is skipped by `use-server` and the request
goes to another up host (balance random; retries and redispatch on connection failures).

Every fast-lane request is logged, one tab-separated line (LOG_FORMAT) in a UDP datagram to a loopback port
the router reads, which writes its access log line and counts its metrics as for the Python lane (`parse_log_line`).

No I/O here: tests check the configuration, the tables and the parsing without processes.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from hashlib import blake2b
from urllib.parse import unquote_to_bytes

from ground.wire import LANE_HEADER
from router.host_groups import group_of_key
from router.placement_policy import HostView, Residency

INFER_PATH = "/inference.GRPCInferenceService/ModelInfer"
LOG_TAG = "mmhost-fast"
# grpc status codes by number (HAProxy logs the number hostd sent, or none for a message followed by OK)
GRPC_CODES = ("OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
              "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
              "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED")
# fields of a log line, in order (LOG_FORMAT): unix ms at the end, tenant, model, version asked, server, HTTP status,
# grpc-status, mmhost-reason, mmhost-served, total ms, body bytes in, bytes out, request id (url-encoded)
LOG_FORMAT = "\\t".join((
    LOG_TAG, "%[date(0,ms)]", "%[var(txn.tenant)]", "%[var(txn.model)]", "%[var(txn.version)]", "%s", "%ST",
    "%[var(txn.gstatus)]", "%[var(txn.reason)]", "%[var(txn.served)]", "%Ta", "%[var(txn.blen)]", "%B",
    "%[var(txn.rid)]",
))


@dataclass(frozen=True)
class FastLaneConfig:
    listen: str  # host:port tenants call
    router: str  # host:port of the Python router (the slow lane), on loopback
    admin_socket: str  # HAProxy's runtime API (unix socket)
    log_target: str  # 127.0.0.1:port, the UDP socket the router reads HAProxy's log lines from
    keys_map: str  # file paths of the two maps (empty at start; filled through the runtime API)
    routes_map: str
    buffer_bytes: int = 65536  # a ModelInfer body must fit (whole) to take the fast lane
    maxconn: int = 4096
    threads: int = 1  # HAProxy's nbthread (router settings: fast_lane_threads)
    connect_timeout_s: float = 2.0
    check_interval_s: float = 1.0  # TCP health checks of each host
    stream_timeout_s: int = 3600  # HAProxy's client/server inactivity limit; deadlines are the callers' (grpc-timeout)
    max_hosts: int = 64  # server slots in backend `hosts`; hosts past them are served by the Python lane only
    listen_pem: str = ""  # tenant TLS on listen: certificate + key in one file ('' = plaintext)
    hostd_tls: tuple[str, str, str] | None = None  # mutual TLS to hostds: (CA file, client cert + key file, name)
    workers: tuple[str, ...] = ()  # Python-lane workers' addresses (router/lane_workers.py): backends w1..wN
    lanes_map: str = ""  # key hash -> worker backend (filled through the runtime API, router/lane_policy.py)


# HAProxy's own refusal when no host is up: UNAVAILABLE no_host, as the Python lane says it
NO_HOST_REPLY = ('http-error status 503 hdr grpc-status 14 hdr grpc-message "no host is available; retry later" '
                 "hdr mmhost-reason no_host hdr retry-after-ms 500")


def _ms(s: float) -> str:
    return f"{max(1, int(s * 1000))}ms"


def render_config(c: FastLaneConfig) -> str:
    """haproxy.cfg for the fast lane. Backend `hosts` has max_hosts server slots (s0, s1, ...), in maintenance
    until the router gives one a host's address at run time (`slot_commands`). Why slots and not HAProxy's
    dynamic servers (`add server`): measured side by side, a dynamic server cost twice the CPU per request, in
    HAProxy and in hostd alike (small model, c16: HAProxy 303 vs 146 us, hostd 1159 vs 665 us)."""
    tls = ""
    if c.hostd_tls is not None:  # verified against the one name every hostd certificate carries (hostd_tls_name)
        ca, pem, name = c.hostd_tls
        tls = (f" ssl verify required ca-file {ca} crt {pem} verifyhost {name} sni str({name}) alpn h2 "
               f"check-sni {name} check-alpn h2")
    slots = "".join(f"    server {slot_name(i)} 127.0.0.1:1 proto h2 disabled check inter {_ms(c.check_interval_s)} "
                    f"fall 2 rise 1{tls}\n" for i in range(c.max_hosts))
    bind = f"{c.listen} ssl crt {c.listen_pem} alpn h2" if c.listen_pem else f"{c.listen} proto h2"
    lane_rules, lane_use, lane_backends = _lanes(c)
    return f"""# written by the mmhost router at start (router/fastlane_config.py); do not edit
global
    nbthread {c.threads}
    maxconn {c.maxconn}
    tune.bufsize {c.buffer_bytes}
    stats socket {c.admin_socket} mode 600 level admin
    log {c.log_target} len 4096 format raw local0
defaults
    mode http
    log global
    option dontlognull
    timeout connect {_ms(c.connect_timeout_s)}
    timeout client {c.stream_timeout_s}s
    timeout server {c.stream_timeout_s}s
    timeout http-request 30s
frontend tenants
    bind {bind}
    option http-buffer-request
    acl infer path {INFER_PATH}
    acl bearer req.hdr(authorization),word(1,' '),lower -m str bearer
    http-request set-var(txn.khash) req.hdr(authorization),word(2,' '),sha2(256),hex,lower if infer bearer
    http-request set-var(txn.tenant) var(txn.khash),map({c.keys_map}) if {{ var(txn.khash) -m found }}
    http-request set-var(txn.model) req.body,ungrpc(1) if {{ var(txn.tenant) -m found }}
    http-request set-var(txn.version) req.body,ungrpc(2) if {{ var(txn.model) -m found }}
    http-request set-var(txn.rkey) var(txn.tenant),concat(/,txn.model,/),concat(,txn.version,) if {{ var(txn.model) -m found }}
    http-request set-var(txn.route) var(txn.rkey),map({c.routes_map}) if {{ var(txn.rkey) -m found }}
    http-request set-log-level silent unless {{ var(txn.route) -m found }}
{lane_rules}    log-format "{LOG_FORMAT}"
    use_backend hosts if {{ var(txn.route) -m found }}
{lane_use}    default_backend router
backend hosts
    http-request set-var(txn.rid) req.body,ungrpc(3),bytes(0,128),url_enc
    http-request del-header mmhost-tenant
    http-request set-header mmhost-tenant %[var(txn.tenant)]
    http-request set-header {LANE_HEADER} fast
    http-request set-var(txn.blen) req.body_len
    http-response set-var(txn.gstatus) res.hdr(grpc-status)
    http-response set-var(txn.reason) res.hdr(mmhost-reason)
    http-response set-var(txn.served) res.hdr(mmhost-served)
    http-response del-header mmhost-served
    use-server %[var(txn.route)] if {{ var(txn.route) -m found }}
    balance random
    option redispatch
    retries 2
    retry-on conn-failure empty-response
    {NO_HOST_REPLY}
{slots}backend router
    server router {c.router} proto h2
{lane_backends}"""


LANES_TABLE = "lanes"  # Python-lane ModelInfer calls per key hash: http_req_rate over LANE_RATE_PERIOD_S
LANE_RATE_PERIOD_S = 2


def lane_backend(i: int) -> str:
    return f"w{i}"


def _lanes(c: FastLaneConfig) -> tuple[str, str, str]:
    """The frontend's rules and the backends for Python-lane workers ('' without workers). Each Python-lane
    ModelInfer is counted by key hash in a stick table (the rates the router reads back to assign tenants), and
    sent to the worker the `lanes` map names, else to the router. A worker's backend has the router as backup:
    while a worker is down (health checks), its tenants are served by the router itself."""
    if not c.workers:
        return "", "", ""
    py = "{ var(txn.khash) -m found } !{ var(txn.route) -m found }"
    rules = (f"    http-request track-sc0 var(txn.khash) table {LANES_TABLE} if {py}\n"
             f"    http-request set-var(txn.lane) var(txn.khash),map({c.lanes_map}) if {py}\n")
    use = "    use_backend %[var(txn.lane)] if { var(txn.lane) -m found }\n"
    backends = (f"backend {LANES_TABLE}\n    stick-table type string len 64 size 1m expire 30s "
                f"store http_req_rate({LANE_RATE_PERIOD_S}s)\n")
    for i, addr in enumerate(c.workers, 1):
        name = lane_backend(i)
        backends += (f"backend {name}\n    option redispatch\n    retries 1\n    retry-on conn-failure\n"
                     f"    server {name} {addr} proto h2 check inter {_ms(c.check_interval_s)} fall 1 rise 1\n"
                     f"    server router {c.router} proto h2 backup\n")
    return rules, use, backends


def worker_commands(i: int, target: str) -> list[str]:
    """Point worker i's server at a (re)started worker's address."""
    return _point(f"{lane_backend(i)}/{lane_backend(i)}", target)


def _point(server: str, target: str) -> list[str]:
    """Runtime API: `server` (backend/name) to `target` (IP:port, [IPv6]:port), out of maintenance."""
    ip, _, port = target.rpartition(":")
    return [f"set server {server} addr {ip.strip('[]')} port {port}", f"enable server {server}"]


def parse_lane_rates(table: str) -> dict[str, float]:
    """`show table lanes` -> key hash -> Python-lane ModelInfer calls per second."""
    out: dict[str, float] = {}
    for line in table.splitlines():
        key = rate = None
        for field in line.split():
            if field.startswith("key="):
                key = field[4:]
            elif field.startswith("http_req_rate(") and "=" in field:
                rate = field.rsplit("=", 1)[1]
        if key and rate is not None:
            try:
                out[key] = int(rate) / LANE_RATE_PERIOD_S
            except ValueError:
                continue
    return out


def slot_name(i: int) -> str:
    return f"s{i}"


def slot_commands(name: str, target: str) -> list[str]:
    """Point a server slot at a host (`target`: IP:port, [IPv6]:port) and take it out of maintenance."""
    return _point(f"hosts/{name}", target)


def route_key(key: str) -> str:
    """A router model key ("t/m" or "t/m/v", router/cluster.py model_key) as HAProxy builds it from a request:
    "t/m/" for the latest version."""
    return key + "/" if key.count("/") == 1 else key


def _score(key: str, address: str) -> bytes:
    return blake2b(f"{key}\x00{address}".encode(), digest_size=8).digest()


def route_table(eligible: Sequence[HostView], fast_tenants: Container[str], names: Mapping[str, str],
                groups: Mapping[str, str] | None = None) -> dict[str, str]:
    """route key -> server name: for each model key of a fast tenant READY on an eligible host of the model's
    host group (`groups`: RouterSettings.host_groups, router/host_groups.py), the holder with the least work
    (queue depth + in flight), ties broken by a hash of key and host (stable between syncs). Hosts without a
    server name (not yet added) are left out."""
    best: dict[str, tuple[int, bytes, str]] = {}
    for view in eligible:
        name = names.get(view.address)
        if name is None:
            continue
        for key, load in view.models.items():
            if load.state is not Residency.READY or key.split("/", 1)[0] not in fast_tenants:
                continue
            if group_of_key(groups or {}, key) != view.group:
                continue
            cand = (load.queue_depth + load.in_flight, _score(key, view.address), name)
            cur = best.get(key)
            if cur is None or cand < cur:
                best[key] = cand
    return {route_key(k): v[2] for k, v in best.items()}


def map_commands(map_path: str, applied: Mapping[str, str], wanted: Mapping[str, str]) -> list[str]:
    """Runtime API commands that turn map `applied` into `wanted`: del, set, add."""
    out = [f"del map {map_path} {k}" for k in applied if k not in wanted]
    for k, v in wanted.items():
        if k not in applied:
            out.append(f"add map {map_path} {k} {v}")
        elif applied[k] != v:
            out.append(f"set map {map_path} {k} {v}")
    return out


def batches(commands: Iterable[str], size: int = 64) -> list[str]:
    """Commands joined by ';' into lines of at most `size` commands (one runtime API connection each)."""
    cmds = list(commands)
    return [";".join(cmds[i:i + size]) for i in range(0, len(cmds), size)]


@dataclass(frozen=True)
class FastRecord:
    """One fast-lane request, as HAProxy logged it."""

    ts: float  # unix seconds, when the request came (the end HAProxy logged, less its total time)
    tenant: str
    model: str
    version: str  # asked for ("" = latest); hostd's mmhost-served names the one that served
    server: str  # HAProxy's server name ("" or "<NOSRV>" when none was chosen)
    status: str  # grpc status name
    reason: str
    served: str
    total_ms: float
    bytes_in: int
    bytes_out: int
    id: str


def _int(s: str) -> int:
    try:
        return int(s)
    except ValueError:
        return 0


def parse_log_line(line: str) -> FastRecord | None:
    """A fast-lane log line (LOG_FORMAT) read back, or None for anything else. HAProxy writes '-' for an empty
    field. The grpc status: the number hostd sent in the headers (a refusal, trailers-only), else OK after an
    HTTP 200 answer (the status then rides in the trailers, which HAProxy cannot log: a unary answer that
    carries a message is OK), else UNAVAILABLE (HAProxy's own error: no host, or the host failed)."""
    f = line.rstrip("\r\n").split("\t")
    if len(f) != 14 or f[0] != LOG_TAG:
        return None
    f = ["" if x == "-" else x for x in f]
    code = _int(f[7]) if f[7] else -1
    if 0 <= code < len(GRPC_CODES):
        status = GRPC_CODES[code]
    elif f[6] == "200" and not f[7]:
        status = "OK"
    else:
        status = "UNAVAILABLE"
    reason = f[8] or ("no_host" if status == "UNAVAILABLE" and not f[7] else "")
    rid = unquote_to_bytes(f[13]).decode("utf-8", "replace") if f[13] else ""
    server = "" if f[5] == "<NOSRV>" else f[5]
    total_ms = float(_int(f[10]))
    return FastRecord(ts=(_int(f[1]) - total_ms) / 1000.0, tenant=f[2], model=f[3], version=f[4], server=server, status=status,
                      reason=reason, served=f[9], total_ms=total_ms, bytes_in=_int(f[11]),
                      bytes_out=_int(f[12]), id=rid)


def ready_version(view: HostView | None, tenant: str, model: str) -> str:
    """The version a call for the latest of `model` was served by on this host: its highest READY version (by
    number where they are numbers), or "" when the view has none."""
    if view is None:
        return ""
    prefix = f"{tenant}/{model}/"
    vs = [k[len(prefix):] for k, m in view.models.items() if k.startswith(prefix) and m.state is Residency.READY]
    if not vs:
        return ""
    return max(vs, key=lambda v: (v.isdigit(), int(v) if v.isdigit() else 0, v))
