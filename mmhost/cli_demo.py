"""`mmhost demo`: build demo models into a local store and serve them, no Redis, no object storage."""

from __future__ import annotations

from pathlib import Path

import typer

CLIENT_SNIPPET = """\
{py} - <<'PY'
import numpy as np, tritonclient.grpc as g
c = g.InferenceServerClient("{addr}")
x = g.InferInput("input", [2, 64], "FP32"); x.set_data_from_numpy(np.random.rand(2, 64).astype(np.float32))
print(c.infer("mlp", [x]).as_numpy("output"))
PY"""


def register(app: typer.Typer) -> None:
    @app.command()
    def demo(
        store: Path = typer.Option(Path("demo_store"), help="local model store to create and serve"),
        listen: str = typer.Option("127.0.0.1:8001", help="hostd gRPC address"),
        metrics_port: int = typer.Option(9101, help="Prometheus port"),
    ) -> None:
        """Build the demo models (ONNX MLP, typed ONNX, TorchScript, torch.export) and serve them."""
        import sys

        from rich.console import Console

        from hostd.server import serve
        from mmhost.cli import setup_logging
        from mmhost.demo_models import seed_store
        from mmhost.settings import HostdSettings

        console = Console()
        setup_logging("INFO")
        with console.status("building demo models"):
            manifests = seed_store(store)
        console.print(f"[bold]demo store[/] {store.resolve()}: " + ", ".join(f"{m.model} v{m.version}" for m in manifests))
        console.print(f"[bold]endpoint[/] {listen} (KServe v2 / Triton gRPC), metrics http://127.0.0.1:{metrics_port}/metrics")
        console.print("[bold]try[/]:\n" + CLIENT_SNIPPET.format(py=sys.executable, addr=listen), markup=False, highlight=False)
        serve(HostdSettings(listen=listen, store=str(store), metrics_port=metrics_port, preload=True, default_tenant="demo"))
