"""`mmhost top`: a live terminal view of a cluster (hosts, resident models, hit rate, queues, memory, shed
rates by tenant), from Redis heartbeats (`--redis`) or by polling hostds (`--hosts`). `--once` prints one
snapshot and exits."""

from __future__ import annotations

import os
import time

import typer


def redis_source(url: str, prefix: str):
    from ground.wire import heartbeat_index_key as index_key
    from ground.wire import heartbeat_status_key as status_key
    from protos import hostd_control_pb2 as hc
    import redis

    r = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)

    def read() -> dict:
        ids = sorted(m.decode() for m in r.smembers(index_key(prefix)))
        raws = r.mget([status_key(prefix, i) for i in ids]) if ids else []
        out = {}
        for raw in raws:
            if raw is not None:  # expired: the host is gone
                s = hc.HostStatus.FromString(raw)
                out[s.address] = s
        return out

    return read


def poll_source(addresses: list[str], timeout_s: float):
    import grpc

    from protos import hostd_control_pb2 as hc
    from protos import hostd_control_pb2_grpc as hc_grpc

    stubs = {a: hc_grpc.HostdControlStub(grpc.insecure_channel(a)) for a in addresses}

    def read() -> dict:
        futures = {a: stub.Status.future(hc.StatusRequest(), timeout=timeout_s) for a, stub in stubs.items()}
        out = {}
        for a, f in futures.items():
            try:
                out[a] = f.result()
            except grpc.RpcError:
                out[a] = None
        return out

    return read


def register(app: typer.Typer) -> None:
    @app.command()
    def top(
        redis: str = typer.Option(None, "--redis", help="cluster from hostd heartbeats in Redis (env MMHOST_REDIS_URL)"),
        hosts: str = typer.Option(None, help="or poll these hostds: ADDR,ADDR"),
        heartbeat_prefix: str = typer.Option(
            None, help="Redis key prefix of heartbeats (env MMHOST_ROUTER_HEARTBEAT_PREFIX; default: mmhost:hosts:)"),
        interval: float = typer.Option(2.0, help="seconds between refreshes"),
        once: bool = typer.Option(False, "--once", help="print one snapshot and exit"),
        models: int = typer.Option(50, help="most model rows shown (busiest first)"),
        timeout: float = typer.Option(1.0, help="--hosts: Status call timeout per host"),
        width: int = typer.Option(None, help="columns; default the terminal's, or 200 when not a terminal"),
    ) -> None:
        """Live view of a cluster: hosts, resident models, device-tier hit rate, queues, shed rates by tenant."""
        from rich.console import Console
        from rich.live import Live

        from mmhost.top_view import Snapshot, render

        redis = redis or (None if hosts else os.environ.get("MMHOST_REDIS_URL"))
        if bool(redis) == bool(hosts):
            raise typer.BadParameter("give --redis URL or --hosts ADDR,ADDR (one of them)")
        if redis:
            prefix = heartbeat_prefix or os.environ.get("MMHOST_ROUTER_HEARTBEAT_PREFIX", "mmhost:hosts:")
            read, source = redis_source(redis, prefix), f"redis {redis} ({prefix})"
        else:
            addrs = [h.strip() for h in hosts.split(",") if h.strip()]
            read, source = poll_source(addrs, timeout), f"{len(addrs)} polled host(s)"

        failed: list[str] = []  # why the last read failed (empty: it did not)

        def snap() -> Snapshot:
            failed.clear()
            try:
                hosts_now = read()
            except Exception as e:  # noqa: BLE001 - show the error, keep going
                failed.append(f"{source}: read failed: {e} (flag --redis or env MMHOST_REDIS_URL)")
                return Snapshot(time.monotonic(), {}, f"{source}: read failed: {e}")
            if hosts and hosts_now and all(v is None for v in hosts_now.values()):
                failed.append(f"{source}: no host answered (flag --hosts)")
            return Snapshot(time.monotonic(), hosts_now, source)

        console = Console(width=width)
        if width is None and not console.is_terminal:
            console = Console(width=200)
        cur = snap()
        if once:
            if failed:  # a snapshot of nothing is not a success: one line, exit 1
                typer.echo(f"error: {failed[0]}", err=True)
                raise typer.Exit(1)
            console.print(render(cur, None, model_limit=models))
            return
        prev = None
        with Live(render(cur, prev, model_limit=models), console=console, screen=False,
                  refresh_per_second=4) as live:
            try:
                while True:
                    time.sleep(interval)
                    prev, cur = cur, snap()
                    live.update(render(cur, prev, model_limit=models))
            except KeyboardInterrupt:
                pass
