"""A tenant's upload through a router against an operator's upload straight to the store, for one ~68 MB ONNX
model (MLP 64-4096-4096-4) into a local store:
  (a) `mmhost upload --store` in process: validate (load, one inference on zeros), copy, manifest;
  (b) `mmhost upload --router`: stream to a router process, validation in its worker process (start, load,
      one inference), publish, index; `runs` times, each a new version.
Prints the median of (b), the router's own validation time (mmhost_router_upload_validate_seconds) and
(b) / (a): what a tenant pays for not holding the store's credentials.

    .venv/bin/python bench/uploads.py [--dims 64,4096,4096,4] [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from catalog.repository import ModelRepository  # noqa: E402
from mmhost.demo_models import build_onnx_mlp  # noqa: E402
from mmhost.upload import UploadRequest, upload  # noqa: E402
from mmhost.upload_client import RouterTarget, header, publish  # noqa: E402
from router.tenants import FileTenants  # noqa: E402
from storage_adapters import open_storage  # noqa: E402
from tests.hostd_proc import metric_value  # noqa: E402
from tests.router.router_proc import RouterProc  # noqa: E402  (starts `mmhost router` as a process)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dims", default="64,4096,4096,4")
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        f = work / "model.onnx"
        build_onnx_mlp(f, tuple(int(d) for d in a.dims.split(",")))
        size = f.stat().st_size
        t0 = time.perf_counter()
        upload(ModelRepository(open_storage(str(work / "operator_store"), None)),
               UploadRequest(tenant="acme", model="m", file=f))
        direct = time.perf_counter() - t0
        key = FileTenants(work / "tenants.json").create("acme")
        (work / "router_store").mkdir()
        # no hostd is needed to publish: the static host is never reached
        r = RouterProc(work, ["--hosts", "127.0.0.1:9", "--tenants", str(work / "tenants.json"),
                              "--store", str(work / "router_store")], {"MMHOST_ROUTER_UPLOADS": "true"})
        try:
            times = []
            for _ in range(a.runs):
                t0 = time.perf_counter()
                publish(RouterTarget(r.addr, key, plaintext=True), header(f, "m"), f)
                times.append(time.perf_counter() - t0)
            text = r.metrics_text()
        finally:
            r.stop()
    validate = metric_value(text, "mmhost_router_upload_validate_seconds_sum") / a.runs
    via = statistics.median(times)
    print(f"model file {size / 1e6:.1f} MB, {a.runs} uploads through the router")
    print(f"(a) operator, --store in process: {direct:.2f} s")
    print(f"(b) tenant, --router: median {via:.2f} s ({', '.join(f'{t:.2f}' for t in times)}); "
          f"of which validation in the worker {validate:.2f} s")
    print(f"(b) / (a) = {via / direct:.2f}")


if __name__ == "__main__":
    main()
