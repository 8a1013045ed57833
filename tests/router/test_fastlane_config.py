"""The fast lane's pure part (router/fastlane_config.py): which models it routes and where, the runtime API
commands that keep HAProxy's maps in step, its log lines read back, and a configuration HAProxy accepts."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from router.fastlane_config import (FastLaneConfig, batches, map_commands, parse_lane_rates, parse_log_line,
                                    ready_version, render_config, route_key, route_table, slot_commands,
                                    worker_commands)
from router.placement_policy import HostView, ModelLoad, Residency

READY, LOADING = Residency.READY, Residency.LOADING


def view(addr: str, **models: ModelLoad) -> HostView:
    return HostView(addr, 0, {k.replace("__", "/"): v for k, v in models.items()}, len(models))


def test_routes_only_ready_models_of_fast_tenants_to_the_least_busy_holder():
    a = view("10.0.0.1:8001", acme__m=ModelLoad(READY, 3, 1), acme__m__1=ModelLoad(READY, 3, 1),
             acme__cold=ModelLoad(LOADING), limited__m=ModelLoad(READY))
    b = view("10.0.0.2:8001", acme__m=ModelLoad(READY, 0, 1), acme__m__1=ModelLoad(READY, 0, 1))
    names = {a.address: "A", b.address: "B"}
    routes = route_table([a, b], frozenset({"acme"}), names)
    assert routes == {"acme/m/": "B", "acme/m/1": "B"}  # b has less work; LOADING and the limited tenant: none


def test_ties_are_broken_the_same_way_every_time_and_hosts_without_a_server_are_left_out():
    a = view("10.0.0.1:8001", t__m=ModelLoad(READY))
    b = view("10.0.0.2:8001", t__m=ModelLoad(READY))
    names = {a.address: "A", b.address: "B"}
    first = route_table([a, b], frozenset({"t"}), names)
    assert first == route_table([b, a], frozenset({"t"}), names)
    assert route_table([a, b], frozenset({"t"}), {b.address: "B"}) == {"t/m/": "B"}


def test_route_keys_are_what_haproxy_builds_from_a_request():
    assert route_key("t/m") == "t/m/"  # model_version empty: the latest
    assert route_key("t/m/3") == "t/m/3"


def test_map_commands_send_only_the_differences():
    cmds = map_commands("/k.map", {"a": "1", "b": "2", "c": "3"}, {"a": "1", "b": "9", "d": "4"})
    assert sorted(cmds) == sorted(["del map /k.map c", "set map /k.map b 9", "add map /k.map d 4"])
    assert map_commands("/k.map", {"a": "1"}, {"a": "1"}) == []
    assert batches([f"c{i}" for i in range(5)], size=2) == ["c0;c1", "c2;c3", "c4"]


def test_a_slot_takes_a_hosts_address():
    assert slot_commands("s3", "10.0.0.7:8001") == ["set server hosts/s3 addr 10.0.0.7 port 8001",
                                                    "enable server hosts/s3"]
    assert slot_commands("s0", "[fd00::7]:8001")[0] == "set server hosts/s0 addr fd00::7 port 8001"


def line(*fields: str) -> str:
    return "\t".join(("mmhost-fast", *fields))


def test_log_lines_read_back():
    ok = parse_log_line(line("1796218834440", "acme", "m", "-", "h_x", "200", "-", "-", "-", "3", "288", "243",
                             "req%0A1") + "\n")
    assert ok is not None
    assert (ok.ts, ok.tenant, ok.model, ok.version, ok.server, ok.status) == (1796218834.437, "acme", "m", "", "h_x", "OK")
    assert (ok.total_ms, ok.bytes_in, ok.bytes_out, ok.id, ok.reason, ok.served) == (3.0, 288, 243, "req\n1", "", "")
    refused = parse_log_line(line("1", "acme", "m", "2", "h_x", "200", "3", "invalid_argument", "v=2;b=1;l=0;q=0;c=0",
                                  "1", "10", "50", "-"))
    assert refused is not None and (refused.status, refused.reason, refused.version) == ("INVALID_ARGUMENT",
                                                                                         "invalid_argument", "2")
    assert refused.served.startswith("v=2")
    nohost = parse_log_line(line("1", "acme", "m", "-", "<NOSRV>", "503", "-", "-", "-", "0", "10", "0", "-"))
    assert nohost is not None and (nohost.status, nohost.reason, nohost.server) == ("UNAVAILABLE", "no_host", "")
    for junk in ("", "[WARNING] Server hosts/x is DOWN", line("1", "too", "few"), "mmhost-fastXX\t" * 13):
        assert parse_log_line(junk) is None


def test_the_served_version_of_a_call_for_the_latest():
    v = view("h:1", t__m__2=ModelLoad(READY), t__m__10=ModelLoad(READY), t__m__11=ModelLoad(LOADING),
             t__mm__99=ModelLoad(READY))
    assert ready_version(v, "t", "m") == "10"  # by number, READY only, this model only
    assert ready_version(v, "t", "x") == "" and ready_version(None, "t", "m") == ""


@pytest.mark.parametrize("workers", [(), ("127.0.0.1:4", "127.0.0.1:5")])
def test_haproxy_accepts_the_configuration(tmp_path, workers):
    exe = shutil.which("haproxy") or "/usr/sbin/haproxy"
    cfg = FastLaneConfig(listen="127.0.0.1:1", router="127.0.0.1:2", admin_socket=str(tmp_path / "a.sock"),
                         log_target="127.0.0.1:3",
                         keys_map=str(tmp_path / "k.map"), routes_map=str(tmp_path / "r.map"),
                         workers=workers, lanes_map=str(tmp_path / "l.map"))
    for m in ("k", "r", "l"):
        (tmp_path / f"{m}.map").write_text("")
    text = render_config(cfg)
    assert ("backend w2" in text) == bool(workers) and ("backend w3" not in text)
    (tmp_path / "h.cfg").write_text(text)
    out = subprocess.run([exe, "-c", "-f", str(tmp_path / "h.cfg")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "[WARNING]" not in out.stderr, out.stderr  # a rule HAProxy would ignore or reorder is a bug here


def test_lane_rates_read_back_from_haproxys_table():
    table = ("# table: lanes, type: string, size:1048576, used:2\n"
             "0x55d1e0: key=aa11 use=0 exp=29871 http_req_rate(2000)=840\n"
             "0x55d1e8: key=bb22 use=1 exp=29990 shard=0 http_req_rate(2000)=7\n\n")
    assert parse_lane_rates(table) == {"aa11": 420.0, "bb22": 3.5}
    assert parse_lane_rates("") == {}


def test_a_restarted_worker_gets_its_address_in_its_own_backend():
    assert worker_commands(2, "127.0.0.1:4567") == ["set server w2/w2 addr 127.0.0.1 port 4567",
                                                     "enable server w2/w2"]


def _haproxy_nbthread(tmp_path, threads: int) -> int:
    """Nbthread as a running HAProxy reports it (`show info` on its runtime API) for render_config(threads=...)."""
    import time

    from tests.servers import free_port, haproxy_ask

    exe = shutil.which("haproxy") or "/usr/sbin/haproxy"
    sock = tmp_path / f"a{threads}.sock"
    cfg = FastLaneConfig(listen=f"127.0.0.1:{free_port()}", router="127.0.0.1:2", admin_socket=str(sock),
                         log_target="127.0.0.1:3", keys_map=str(tmp_path / "k.map"),
                         routes_map=str(tmp_path / "r.map"), max_hosts=1, threads=threads)
    (tmp_path / "k.map").write_text("")
    (tmp_path / "r.map").write_text("")
    (tmp_path / "h.cfg").write_text(render_config(cfg))
    proc = subprocess.Popen([exe, "-db", "-q", "-f", str(tmp_path / "h.cfg")], stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not sock.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "HAProxy did not start"
            time.sleep(0.05)
        out = haproxy_ask(sock, "show info")
    finally:
        proc.kill()
        proc.wait()
    return int(next(line.split(":", 1)[1] for line in out.splitlines() if line.startswith("Nbthread:")))


def test_haproxy_runs_the_threads_it_is_given(tmp_path):
    """fast_lane_threads: HAProxy runs that many threads, here one more than it would choose itself."""
    import os

    cpus = len(os.sched_getaffinity(0))
    assert _haproxy_nbthread(tmp_path, cpus + 1) == cpus + 1


def test_fast_lane_threads_zero_means_one_per_usable_cpu():
    """fast_lane_threads=0 (the default): the router's usable CPUs (ground/cpus.py), not HAProxy's own count."""
    import asyncio

    from ground.cpus import usable_cpus
    from router.fastlane import FastLane

    for threads, want in ((0, min(64, usable_cpus())), (3, 3)):
        fl = FastLane(listen="127.0.0.1:1", router="127.0.0.1:2", threads=threads, on_records=lambda recs: None)
        try:
            assert fl.cfg.threads == want
            assert f"    nbthread {want}\n" in render_config(fl.cfg)
        finally:
            asyncio.run(fl.stop())
