"""Shared by the deploy/ tests: the command-line tools (installed by .ci/install_tools.sh or the `test` extra),
the rendered overlays, and what the code really exports (metric and label names)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
OVERLAYS = sorted(p.name for p in (DEPLOY / "k8s" / "overlays").iterdir() if (p / "kustomization.yaml").exists())
# Labels Prometheus adds to every scraped series (target labels; le/quantile on histogram/summary series).
TARGET_LABELS = {"instance", "job", "pod", "namespace", "service", "container", "endpoint", "le", "quantile"}
# Series Prometheus itself makes for every target.
PROMETHEUS_SERIES = {"up"}


def tool(name: str) -> str:
    """The venv's copy first (pip-installed tools), then PATH. Missing is a failure, never a skip."""
    venv = Path(sys.executable).parent / name
    if venv.exists():
        return str(venv)
    found = shutil.which(name)
    if not found:
        pytest.fail(f"{name} is not installed: run `make tools` (.ci/install_tools.sh)")
    return found


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, **kw)


@pytest.fixture(scope="session")
def rendered() -> dict[str, list[dict]]:
    """overlay name -> the objects `kubectl kustomize` renders for it."""
    kubectl = tool("kubectl")
    out = {}
    for name in OVERLAYS:
        r = run([kubectl, "kustomize", str(DEPLOY / "k8s" / "overlays" / name)])
        assert r.returncode == 0, f"kubectl kustomize {name} failed:\n{r.stderr}"
        out[name] = [d for d in yaml.safe_load_all(r.stdout) if d]
    return out


def _metric_objects(obj, seen=None):
    """prometheus_client metric objects reachable from a metrics holder (HostdMetrics and its CacheMetrics)."""
    from prometheus_client.metrics import MetricWrapperBase

    seen = seen if seen is not None else set()
    if id(obj) in seen:
        return
    seen.add(id(obj))
    for v in vars(obj).values():
        if isinstance(v, MetricWrapperBase):
            yield v
        elif hasattr(v, "__dict__") and type(v).__module__.split(".")[0] in ("hostd", "router"):
            yield from _metric_objects(v, seen)


@pytest.fixture(scope="session")
def exported() -> dict[str, set[str]]:
    """Every series name hostd and the router export -> the label names it carries, built from the code:
    each metrics class is instantiated on its own registry and every family it registers is expanded with the
    suffixes the exposition format gives its type."""
    from hostd.metrics import HostdMetrics
    from router.metrics import RouterMetrics

    suffixes = {"counter": ["_total", "_created"], "histogram": ["_bucket", "_sum", "_count", "_created"],
                "summary": ["", "_sum", "_count", "_created"], "gauge": [""], "info": ["_info"],
                "unknown": [""]}  # Triton's nv_inference_* (hostd/triton_metrics.py): exact names, untyped
    names: dict[str, set[str]] = {}
    router = RouterMetrics()
    router.redis_mode()  # the series a router in Redis mode adds
    router.fast_lane_mode()  # and one with fast_lane=haproxy
    router.lane_workers_mode()  # and with fast_lane_workers
    for holder in (HostdMetrics(), router):
        labels = {m._name: set(m._labelnames) for m in _metric_objects(holder)}
        families = list(holder.registry.collect())
        assert families, f"{type(holder).__name__} registered no metrics"
        for fam in families:
            for sfx in suffixes[fam.type]:
                names[fam.name + sfx] = labels.get(fam.name, set()) | TARGET_LABELS
    for n in PROMETHEUS_SERIES:
        names[n] = set(TARGET_LABELS)
    return names


@pytest.fixture()
def clean_env(monkeypatch):
    """No MMHOST_* from the developer's shell may leak into settings checks."""
    for k in list(os.environ):
        if k.startswith("MMHOST_"):
            monkeypatch.delenv(k)
    return monkeypatch
