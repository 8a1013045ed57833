"""The fast lane's shell: runs HAProxy in front of the router (fast_lane=haproxy), keeps its hosts, keys and
routes in step with the router's views through HAProxy's runtime API, and turns HAProxy's log lines into the
router's access log lines and metrics. What the fast lane serves and why: router/fastlane_config.py.

HAProxy runs as a child process (`haproxy -db`), supervised: if it exits, it is started again at the next
sync and its state is sent again whole; while it is down the tenants' port does not answer. Its runtime API
is a unix socket in a private directory (0700); the router alone talks to it. Its log lines come as
UDP datagrams to a loopback port the router bound, read by a thread and handed to the event loop in batches (one
wake-up per batch, not per request). HAProxy never waits for that reader: past a full socket buffer it drops
lines and counts them (DroppedLogs, exported as mmhost_router_fast_lane_log_dropped).

What changes for a tenant on the fast lane (docs/fast-lane.md): a host's retryable refusal
(`draining`, `no_capacity`) reaches the caller instead of being retried on another host by the router (the
router withdraws a draining host's routes at its next refresh); a host that stops answering is skipped by
HAProxy's health checks (TCP, every fast_lane_check_interval_s) and a request whose connection fails is
retried on another up host; the router's deadline-feasibility check and per-router byte budget are not
applied (the body is at most fast_lane_buffer_bytes, held by HAProxy, bounded by its maxconn). TLS: HAProxy
terminates the tenants' TLS (tls_cert/tls_key) and calls hostds with the router's client certificate
(hostd_ca, hostd_client_cert/key), verifying hostd_tls_name. Rotated certificate files reach HAProxy at the
router's next refresh (`refresh_tls`: the runtime API's `set/commit ssl cert` and `ssl ca-file`), without a
restart, as they reach the Python lane; a rotation caught half-way (a key that does not match its certificate)
waits for the next refresh, as ground/tls.py's watchers do.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from ipaddress import ip_address
from pathlib import Path

from ground.children import dies_with_parent
from ground.cpus import usable_cpus
from ground.tls import TLSFiles
from router.fastlane_config import (LANES_TABLE, FastLaneConfig, FastRecord, batches, map_commands, parse_lane_rates,
                                    parse_log_line, render_config, worker_commands,
                                    route_table, slot_commands, slot_name)
from router.placement_policy import HostView

log = logging.getLogger(__name__)

READ_CHUNK = 1 << 16
BATCH_S = 0.05  # log lines are handed over at most this often (20 wake-ups a second, however many requests)
MAX_BATCH = 8192
DRAIN_S = 0.005  # under load the log reader wakes this often and reads what queued meanwhile (_read_logs)
LOG_RCVBUF = 4 << 20  # log lines waiting for the reader; past it HAProxy drops lines (and counts them)


class FastLaneError(RuntimeError):
    pass


class _Watched:
    """Certificate files HAProxy holds, as the router reads them (`files`), and where HAProxy has them: `pem`,
    the certificate and its key in one file of the private directory; `ca`, the CA bundle's path in
    HAProxy's configuration (None: no CA)."""

    def __init__(self, files: TLSFiles, pem: str, ca: str | None = None) -> None:
        self.files, self.pem, self.ca = files, pem, ca
        self.pending = False  # read, but not yet taken by HAProxy: sent again at the next refresh


def haproxy_binary(configured: str = "") -> str:
    found = configured or shutil.which("haproxy") or ("/usr/sbin/haproxy" if os.path.exists("/usr/sbin/haproxy") else "")
    if not found:
        raise FastLaneError("fast_lane=haproxy needs HAProxy 2.6 or later (Debian: apt-get install haproxy), or "
                            "fast_lane_binary set to its path")
    return found


class FastLane:
    def __init__(self, *, listen: str, router: str, binary: str = "", buffer_bytes: int = 65536, maxconn: int = 4096,
                 threads: int = 0, check_interval_s: float = 1.0, max_hosts: int = 64,
                 listen_tls: tuple[str, str] | None = None, hostd_tls: tuple[str, str, str, str] | None = None,
                 workers: Sequence[str] = (), on_records: Callable[[list[FastRecord]], None]) -> None:
        """`listen_tls`: (certificate, key) tenants see on `listen`; `hostd_tls`: (CA, client certificate,
        client key, the name hostd certificates carry) for mutual TLS to hostds. HAProxy wants a certificate
        and its key in one file: both are copied into the private directory (0600), at start and again whenever
        the files change (`refresh_tls`: HAProxy takes them through its runtime API, without a restart)."""
        self.binary = haproxy_binary(binary)
        # HAProxy's log lines: UDP on loopback, not a unix datagram socket, whose queue is capped at
        # net.unix.max_dgram_qlen datagrams (10 on this kind of machine: lines were lost at 400 requests/s)
        self._log_sock: socket.socket | None = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._log_sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, LOG_RCVBUF)
        self._log_sock.bind(("127.0.0.1", 0))
        log_target = f"127.0.0.1:{self._log_sock.getsockname()[1]}"
        self.dir = Path(tempfile.mkdtemp(prefix="mmhost-fastlane-"))  # 0700: the admin socket lives here
        self._watched: list[_Watched] = []  # raises at start on files that cannot be used, as the Python lane does
        if listen_tls:
            self._watched.append(_Watched(TLSFiles(*listen_tls), str(self.dir / "listen.pem")))
        if hostd_tls:
            self._watched.append(_Watched(TLSFiles(hostd_tls[1], hostd_tls[2], hostd_tls[0]),
                                          str(self.dir / "hostd-client.pem"), hostd_tls[0]))
        for w in self._watched:
            self._write_pem(w)
        listen_pem = self._watched[0].pem if listen_tls else ""
        upstream = (hostd_tls[0], self._watched[-1].pem, hostd_tls[3]) if hostd_tls else None
        self.cfg = FastLaneConfig(listen=listen, router=router, admin_socket=str(self.dir / "admin.sock"),
                                  log_target=log_target,
                                  keys_map=str(self.dir / "keys.map"), routes_map=str(self.dir / "routes.map"),
                                  buffer_bytes=buffer_bytes, maxconn=maxconn,
                                  threads=threads or min(64, usable_cpus()),
                                  check_interval_s=check_interval_s, max_hosts=max_hosts, listen_pem=listen_pem, hostd_tls=upstream,
                                  workers=tuple(workers), lanes_map=str(self.dir / "lanes.map"))
        self.on_records = on_records
        self.proc: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = asyncio.Lock()
        self._reset_applied()

    @staticmethod
    def _pem_text(w: _Watched) -> str:
        """The certificate (chain) and its key as one PEM text with no blank line: the runtime API ends a
        payload at the first blank line."""
        m = w.files.material
        return _no_blank_lines(m.cert.decode() + "\n" + m.key.decode())

    def _write_pem(self, w: _Watched) -> None:
        """The file HAProxy's configuration names (a restarted HAProxy reads it), owner-only."""
        fd = os.open(w.pem, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self._pem_text(w) + "\n")

    async def refresh_tls(self) -> list[str]:
        """Give HAProxy the certificate files that changed since it last took them, through the runtime API
        (`set ssl cert` and `commit ssl cert`; the CA bundle with `set ssl ca-file` and `commit ssl ca-file`), so
        new connections use them; connections already open keep their session. A pair HAProxy took is written to
        its file in the private directory, so a restarted HAProxy starts with it (and not with one it refused).
        Returns the files HAProxy took. FastLaneError when HAProxy refused one: it keeps serving the previous
        certificate, and the files are sent again at the next refresh."""
        took: list[str] = []
        for w in self._watched:
            if not (await asyncio.to_thread(w.files.changed) or w.pending):
                continue
            w.pending = True
            payloads = [("cert", w.pem, self._pem_text(w))]
            if w.ca is not None and w.files.material.ca is not None:
                payloads.append(("ca-file", w.ca, _no_blank_lines(w.files.material.ca.decode())))
            async with self._lock:
                for kind, path, text in payloads:
                    # a transaction a failed commit left open would be committed by a `commit` after a failed
                    # `set`; abort it first ("No ongoing transaction!" when there is none)
                    await self.command(f"abort ssl {kind} {path}")
                    answer = await self.command(f"set ssl {kind} {path} <<\n{text}\n")
                    answer += await self.command(f"commit ssl {kind} {path}")
                    if "Success" not in answer:
                        raise FastLaneError(f"HAProxy did not take {path}: {' '.join(answer.split())[:500]}")
                    took.append(path)
            self._write_pem(w)  # only what HAProxy took: a restarted HAProxy starts with it
            w.pending = False
            log.info("fast lane: HAProxy took the rotated certificate from %s", w.files.cert_path)
        return took

    def _reset_applied(self) -> None:
        self.servers: dict[str, str] = {}  # address -> its server slot, every host given one (enabled or not)
        self.targets: dict[str, str] = {}  # address -> the IP:port HAProxy connects to
        self.enabled: set[str] = set()
        self._no_slot: set[str] = set()
        self.keys: dict[str, str] = {}
        self.routes: dict[str, str] = {}
        self.lanes: dict[str, str] = {}  # key hash -> Python-lane worker backend (fast_lane_workers)

    @property
    def up(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def addresses(self) -> dict[str, str]:
        """server name -> host address (for the access log's host field)."""
        return {n: a for a, n in self.servers.items()}

    # -- process ------------------------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        cfg_path = self.dir / "haproxy.cfg"
        cfg_path.write_text(render_config(self.cfg))
        for m in (self.cfg.keys_map, self.cfg.routes_map, self.cfg.lanes_map):
            Path(m).write_text("")
        check = await asyncio.to_thread(subprocess.run, [self.binary, "-c", "-q", "-f", str(cfg_path)],
                                        capture_output=True, text=True)
        if check.returncode != 0:
            raise FastLaneError(f"HAProxy refused the fast lane's configuration: {check.stderr.strip()[:2000]}")
        self._reset_applied()
        if self._reader is None and self._log_sock is not None:  # once: a restarted HAProxy logs to the same port
            self._reader = threading.Thread(target=self._read_logs, args=(self._log_sock,), name="fast-lane-log",
                                            daemon=True)
            self._reader.start()
        # started from the event loop's thread, the one that lives as long as the router: PDEATHSIG follows the
        # thread that forked. SIGUSR1 is HAProxy's soft stop (it finishes the calls in flight)
        self.proc = subprocess.Popen(dies_with_parent([self.binary, "-db", "-q", "-f", str(cfg_path)], signal.SIGUSR1),
                                     stdin=subprocess.DEVNULL)
        for _ in range(100):  # the admin socket answers once HAProxy is up
            if self.proc.poll() is not None:
                raise FastLaneError(f"HAProxy exited at start (code {self.proc.returncode}); is {self.cfg.listen} free?")
            try:
                await self.command("show info")
                return
            except OSError:
                await asyncio.sleep(0.05)
        raise FastLaneError("HAProxy's runtime API did not answer within 5 s")

    async def ensure_running(self) -> bool:
        """Start HAProxy again if it exited. True if it was restarted."""
        if self.up or self.proc is None:
            return False
        log.error("fast lane: HAProxy exited (code %s); starting it again", self.proc.returncode)
        await self.start()
        return True

    async def stop(self, grace_s: float = 2.0) -> None:
        """Soft stop (SIGUSR1: stop listening, finish the requests in flight), then a kill past `grace_s`."""
        p = self.proc
        if p is not None and p.poll() is None:
            p.send_signal(signal.SIGUSR1)
            try:
                await asyncio.to_thread(p.wait, grace_s)
            except subprocess.TimeoutExpired:
                p.kill()
                await asyncio.to_thread(p.wait)
        if self._log_sock is not None:  # an empty datagram wakes the reader, which then stops
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.sendto(b"", self._log_sock.getsockname())
        if self._reader is not None:
            self._reader.join(timeout=1.0)
        if self._log_sock is not None:
            self._log_sock.close()
            self._log_sock = None
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- runtime API ---------------------------------------------------------------------------------

    async def command(self, line: str) -> str:
        reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(self.cfg.admin_socket), 2.0)
        try:
            writer.write(line.encode() + b"\n")
            await writer.drain()
            return (await asyncio.wait_for(reader.read(), 5.0)).decode(errors="replace")
        finally:
            writer.close()

    async def _run(self, commands: Sequence[str]) -> list[str]:
        """Send commands in batches; the answers that say something went wrong."""
        problems: list[str] = []
        for line in batches(commands):
            out = await self.command(line)
            problems += [x for x in out.splitlines() if x.strip() and not _benign(x)]
        return problems

    def _free_slot(self) -> str | None:
        """A slot no host has had, else the slot of a host not up now (whose route is gone with it)."""
        used = set(self.servers.values())
        for i in range(self.cfg.max_hosts):
            if slot_name(i) not in used:
                return slot_name(i)
        for addr, name in list(self.servers.items()):
            if addr not in self.enabled:
                del self.servers[addr]
                self.targets.pop(addr, None)
                return name
        return None

    async def _resolve(self, address: str) -> str | None:
        """host:port with the host as an IP (a server slot takes an address, not a name). Hostds are dialled by
        pod IP: an IP literal is taken as it is, with no resolver call (a thread hop per host every refresh)."""
        host, _, port = address.rpartition(":")
        try:
            ip_address(host.strip("[]"))
            return address
        except ValueError:
            pass
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM)
        except (OSError, ValueError):
            return None
        ip = infos[0][4][0]
        return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"

    async def set_worker(self, index: int, address: str) -> None:
        """A restarted Python-lane worker's address, to its backend (and to the configuration a restarted
        HAProxy reads)."""
        workers = list(self.cfg.workers)
        workers[index - 1] = address
        self.cfg = replace(self.cfg, workers=tuple(workers))
        if self.up:
            problems = await self._run(worker_commands(index, address))
            if problems:
                log.warning("fast lane: HAProxy said: %s", "; ".join(problems[:5]))

    async def lane_rates(self) -> dict[str, float]:
        """key hash -> Python-lane ModelInfer calls/s lately (HAProxy's stick table; {} without workers)."""
        if not self.cfg.workers:
            return {}
        return parse_lane_rates(await self.command(f"show table {LANES_TABLE}"))

    async def sync(self, eligible: Sequence[HostView], keys: Mapping[str, str], fast_tenants: frozenset[str],
                   groups: Mapping[str, str] | None = None, lanes: Mapping[str, str] | None = None) -> None:
        """Make HAProxy's servers, keys and routes what the router's views say (only the differences are sent).
        A host that leaves the view is put in maintenance; its slot stays its own (it may come back) until
        another host needs a slot and none is free."""
        async with self._lock:  # the caller restarts HAProxy first (ensure_running): a new one starts empty
            cmds: list[str] = []
            up: set[str] = set()
            for v in eligible:
                target = await self._resolve(v.address)
                if target is None:
                    continue
                name = self.servers.get(v.address) or self._free_slot()
                if name is None:
                    if v.address not in self._no_slot:
                        self._no_slot.add(v.address)
                        log.warning("fast lane: no server slot left for host %s (%d in use): the Python lane "
                                    "serves it alone", v.address, self.cfg.max_hosts)
                    continue
                up.add(v.address)
                if self.targets.get(v.address) != target:
                    cmds += slot_commands(name, target)
                elif v.address not in self.enabled:
                    cmds.append(f"enable server hosts/{name}")
                self.servers[v.address], self.targets[v.address] = name, target
            for addr in self.enabled - up:
                cmds.append(f"disable server hosts/{self.servers[addr]}")
            problems = await self._run(cmds)
            self.enabled = up
            names = {a: n for a, n in self.servers.items() if a in up}
            wanted_keys = {h: t for h, t in keys.items() if t in fast_tenants}
            wanted_routes = route_table(eligible, fast_tenants, names, groups)
            wanted_lanes = dict(lanes or {}) if self.cfg.workers else {}
            problems += await self._run(map_commands(self.cfg.keys_map, self.keys, wanted_keys)
                                        + map_commands(self.cfg.routes_map, self.routes, wanted_routes)
                                        + map_commands(self.cfg.lanes_map, self.lanes, wanted_lanes))
            self.keys, self.routes, self.lanes = wanted_keys, wanted_routes, wanted_lanes
            if problems:
                log.warning("fast lane: HAProxy said: %s", "; ".join(problems[:5]))

    async def dropped_logs(self) -> int:
        for line in (await self.command("show info")).splitlines():
            if line.startswith("DroppedLogs:"):
                return int(line.split(":", 1)[1])
        return 0

    # -- log lines ---------------------------------------------------------------------------------------

    def _read_logs(self, sock: socket.socket) -> None:
        """The log lines, one datagram each, handed to the event loop in batches, at most every BATCH_S: one
        wake-up of the loop per line cost the router ~250 us of CPU per request (bench, concurrency 1). The
        reader thread itself wakes at most every DRAIN_S while lines come, and then reads all that queued
        meanwhile without blocking: a wake-up of this thread per line cost ~45 us of the router's CPU per
        fast call (bench/router.py --small, c16)."""
        assert self._loop is not None
        pending: list[FastRecord] = []
        last = time.monotonic()
        while True:
            wait = BATCH_S - (time.monotonic() - last) if pending else None
            sock.settimeout(max(wait, 0.001) if wait is not None else None)
            try:
                raw = sock.recv(READ_CHUNK)
            except TimeoutError:
                raw = None
            except OSError:  # closed: stopping
                return
            if raw == b"":  # stop() says so
                return
            if raw:
                self._take(raw, pending)
                time.sleep(DRAIN_S)  # let the next lines queue in the socket, then read them in one go
                # non-blocking for the drain (the loop's top sets its timeout again): a recv with MSG_DONTWAIT
                # on a socket with a timeout still waits for that timeout, then raises TimeoutError
                sock.setblocking(False)
                while len(pending) < MAX_BATCH:
                    try:
                        raw = sock.recv(READ_CHUNK)
                    except BlockingIOError:
                        break
                    except OSError:
                        return
                    if raw == b"":
                        return
                    self._take(raw, pending)
            if pending and (raw is None or time.monotonic() - last >= BATCH_S or len(pending) >= MAX_BATCH):
                try:
                    self._loop.call_soon_threadsafe(self.on_records, pending)
                except RuntimeError:  # the loop is closed: shutting down
                    return
                pending, last = [], time.monotonic()
            elif not pending:
                last = time.monotonic()

    @staticmethod
    def _take(raw: bytes, pending: list[FastRecord]) -> None:
        text = raw.decode("utf-8", "replace")
        rec = parse_log_line(text)
        if rec is not None:
            pending.append(rec)
        elif text.strip():  # HAProxy's own events (a server up or down, a stop)
            log.info("fast lane: %s", text.strip()[:500])


def _no_blank_lines(pem: str) -> str:
    return "\n".join(line for line in pem.splitlines() if line.strip())


def _benign(answer: str) -> bool:
    """Runtime API answers that are not problems: empty, confirmations, and removing what is already gone."""
    a = answer.strip()
    return a == "Done." or a.startswith("IP changed from") or a.startswith("no need to change the addr") \
        or a.startswith("port changed from") or "no need to change the port" in a
