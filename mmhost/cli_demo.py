"""`mmhost demo`: build demo models into a local store, start two hostds (subprocesses) and one router in
front of them, create a demo tenant and print its API key. No Redis, no object storage. Ctrl-C stops all."""

from __future__ import annotations

from pathlib import Path

import typer

CLIENT_SNIPPET = """\
{py} - <<'PY'
import numpy as np, tritonclient.grpc as g
c = g.InferenceServerClient("{addr}")
h = {{"authorization": "Bearer {key}"}}
x = g.InferInput("input", [2, 64], "FP32"); x.set_data_from_numpy(np.random.rand(2, 64).astype(np.float32))
print(c.infer("mlp", [x], headers=h).as_numpy("output"))
print([m.name for m in c.get_model_repository_index(headers=h, as_json=False).models])
PY"""

CURL_SNIPPET = """\
curl -s -H 'Authorization: Bearer {key}' -H 'Content-Type: application/json' http://{rest}/v2/models/mlp/infer \\
  -d '{{"inputs": [{{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": [{zeros}]}}]}}'"""


def _wait_serving(addr: str, proc, timeout: float = 60.0) -> None:
    from ground.serving import wait_serving

    try:
        wait_serving(addr, proc, "hostd", timeout=timeout)
    except (RuntimeError, TimeoutError) as e:
        raise SystemExit(str(e)) from None


def taken_ports(listen: str, hostd_ports: list[int], metrics_port: int, rest_listen: str = "") -> list[str]:
    """The demo's addresses something already listens on (another `mmhost demo`, most likely)."""
    import socket

    host, port = listen.rsplit(":", 1)
    wanted = [(host, int(port), "--listen")]
    wanted += [("127.0.0.1", p, "--hostd-ports") for p in hostd_ports]
    wanted += [("127.0.0.1", metrics_port + i, "--metrics-port") for i in range(len(hostd_ports) + 1)]
    if rest_listen:
        rhost, rport = rest_listen.rsplit(":", 1)
        wanted.append((rhost, int(rport), "--rest-listen"))
    taken = []
    for h, p, flag in wanted:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((h, p))
            except OSError:
                taken.append(f"{h}:{p} ({flag})")
    return taken


def _lock(workdir: Path):
    """Held while the demo runs: a second demo on the same workdir must not rotate the first one's key."""
    import fcntl

    f = open(workdir / "demo.lock", "w")  # noqa: SIM115 - held for the demo's life
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        return None
    return f


def _stop_all(procs) -> None:
    import signal
    import subprocess

    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(40)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


def register(app: typer.Typer) -> None:
    @app.command()
    def demo(
        store: Path = typer.Option(Path("demo_store"), help="local model store to create and serve"),
        listen: str = typer.Option("127.0.0.1:8001", help="router gRPC address (what tenants call)"),
        hostd_ports: str = typer.Option("8011,8012", help="gRPC ports of the two hostds (127.0.0.1)"),
        metrics_port: int = typer.Option(9100, help="router Prometheus port; hostds use the next ones"),
        rest_listen: str = typer.Option("127.0.0.1:8000", help="router KServe v2 REST address; '' turns it off"),
        workdir: Path = typer.Option(Path(".mmhost-demo"), help="tenants file, hostd logs and caches"),
    ) -> None:
        """Build the demo models and serve them: one router, two hostds, a demo tenant with a fresh key."""
        import os
        import subprocess
        import sys

        from rich.console import Console

        from mmhost.cli import setup_logging
        from mmhost.demo_models import seed_store
        from router.server import serve
        from ground.settings import RouterSettings
        from router.tenants import FileTenants

        console = Console()
        ports = [int(p) for p in hostd_ports.split(",")]
        # before anything is built, created or rotated: a running demo keeps its key and its ports
        taken = taken_ports(listen, ports, metrics_port, rest_listen)
        if taken:
            typer.echo(f"error: demo ports in use: {', '.join(taken)}; is another `mmhost demo` running? Stop it, "
                       "or pass other ports", err=True)
            raise typer.Exit(1)
        workdir.mkdir(parents=True, exist_ok=True)
        lock = _lock(workdir)
        if lock is None:
            typer.echo(f"error: another `mmhost demo` runs with {workdir} (its key stays as it is); stop it, or "
                       "pass --workdir", err=True)
            raise typer.Exit(1)
        setup_logging("INFO")
        with console.status("building demo models"):
            manifests = seed_store(store)
        console.print(f"[bold]demo store[/] {store.resolve()}: " + ", ".join(f"{m.model} v{m.version}" for m in manifests))
        store, workdir = store.resolve(), workdir.resolve()
        repo_root = Path(__file__).resolve().parent.parent  # children run `python -m mmhost.cli` from here
        tenants = FileTenants(workdir / "tenants.json")
        key = tenants.rotate_key("demo") if tenants.get("demo") else tenants.create("demo")

        hosts, procs = [], []
        try:
            for i, port in enumerate(ports):
                addr = f"127.0.0.1:{port}"
                log = open(workdir / f"hostd-{port}.log", "ab")  # noqa: SIM115 - lives as long as the child
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "mmhost.cli", "hostd", "--listen", addr, "--store", str(store),
                     "--metrics-port", str(metrics_port + 1 + i), "--cache-dir", str(workdir / f"cache-{port}"),
                     "--default-tenant", "demo"],
                    stdout=log, stderr=subprocess.STDOUT, cwd=repo_root,
                    # the demo may: no certificates, and direct calls without mmhost-tenant act as "demo"
                    env={**os.environ, "MMHOST_HOSTD_PLAINTEXT": "true", "MMHOST_HOSTD_DEV_MODE": "true"},
                ))
                hosts.append(addr)
            with console.status("starting two hostds"):
                for addr, p in zip(hosts, procs, strict=True):
                    _wait_serving(addr, p)
            console.print(f"[bold]hostds[/] {', '.join(hosts)} (logs in {workdir.resolve()})")
            console.print(f"[bold]endpoint[/] {listen} (KServe v2 / Triton gRPC, through the router), "
                          f"metrics http://127.0.0.1:{metrics_port}/metrics")
            console.print(f"[bold]demo tenant[/] demo, API key (new on every start): {key}", highlight=False,
                          soft_wrap=True)
            console.print("[bold]try[/]:")
            console.print(CLIENT_SNIPPET.format(py=sys.executable, addr=listen, key=key), markup=False,
                          highlight=False, soft_wrap=True)
            if rest_listen:
                console.print(f"[bold]or over REST[/] (KServe v2 HTTP/JSON on {rest_listen}):")
                console.print(CURL_SNIPPET.format(key=key, rest=rest_listen, zeros=", ".join(["0.5"] * 64)),
                              markup=False, highlight=False, soft_wrap=True)
            console.print("[bold]publish a model of your own[/] (as the tenant: its key, no store access):")
            console.print(f"mmhost upload model.onnx --router {listen} --plaintext --api-key {key} --model mine",
                          markup=False, highlight=False, soft_wrap=True)
            serve(RouterSettings(listen=listen, hosts=hosts, tenants_file=workdir / "tenants.json", store=str(store),
                                 metrics_port=metrics_port, refresh_interval_s=0.5, plaintext=True,
                                 rest_listen=rest_listen, uploads=True), exit_process=False)
        finally:
            _stop_all(procs)
            lock.close()
