"""Loading one model version: fetch its files to the local disk tier, verify size and sha256 before anything
is deserialized, build the runtime session, warm it up, and measure the memory it really took.

Runs in a worker thread (blocking I/O and CPU work), one load at a time per device, so that the memory
measured around a load belongs to that load alone.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hostd.errors import Unavailable
from hostd.memory import MemoryProbe
from hostd.runtimes.base import DeviceSpec, LoadedModel, RuntimeLoadError, load_model, prepare_runtime
from mmhost.manifest import DATATYPES, ModelManifest
from storage_adapters.base import ObjectNotFound, Storage, StorageError
from storage_adapters.repository import ModelRepository

log = logging.getLogger(__name__)
_CHUNK = 1 << 20


class IntegrityError(Unavailable):
    """A fetched file does not match its manifest (corrupt, truncated or substituted)."""


class LoadFailed(Unavailable):
    pass


@dataclass
class LoadResult:
    model: LoadedModel
    memory_bytes: int
    memory_measured: bool  # False when the probe saw too little change and the file size was used
    timings: dict[str, float] = field(default_factory=dict)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def warmup_inputs(m: ModelManifest) -> dict[str, np.ndarray]:
    """Zeros of every input, batch 1, dynamic dimensions 1."""
    out = {}
    for t in m.inputs:
        shape = [1 if d == -1 else d for d in t.shape]
        if t.datatype == "BYTES":
            arr = np.empty(shape, dtype=object)
            arr.fill(b"")
        else:
            arr = np.zeros(shape, dtype=DATATYPES[t.datatype])
        out[t.name] = arr
    return out


class Loader:
    def __init__(self, storage: Storage, cache_dir: Path, device: DeviceSpec, probe: MemoryProbe) -> None:
        self.storage = storage
        self.cache_dir = Path(cache_dir)
        self.device = device
        self.probe = probe
        self._lock = threading.Lock()

    def local_dir(self, m: ModelManifest) -> Path:
        return self.cache_dir / m.tenant / m.model / m.version

    def _name(self, m: ModelManifest) -> str:
        return f"model {m.model!r} version {m.version!r}"

    def fetch(self, m: ModelManifest, timings: dict[str, float] | None = None) -> Path:
        """Every file of the version on local disk, verified. Files already verified are kept.
        Adds seconds spent downloading ('fetch') and hashing ('verify') to `timings`."""
        timings = timings if timings is not None else {}
        timings.setdefault("fetch", 0.0)
        timings.setdefault("verify", 0.0)
        d = self.local_dir(m)
        d.mkdir(parents=True, exist_ok=True)
        for f in m.files:
            dest = d / f.path
            marker = dest.with_name(dest.name + ".sha256")
            if dest.is_file() and dest.stat().st_size == f.size and marker.is_file() and marker.read_text() == f.sha256:
                continue
            tmp = dest.with_name(f".part-{dest.name}-{os.getpid()}-{threading.get_ident()}")
            t0 = time.perf_counter()
            try:
                self.storage.download(ModelRepository.file_key(m, f.path), tmp)
            except ObjectNotFound as e:
                raise LoadFailed(f"{self._name(m)}: file {f.path!r} is missing from storage: {e}", reason="missing_file") from e
            except StorageError as e:
                tmp.unlink(missing_ok=True)
                raise Unavailable(f"{self._name(m)}: storage unavailable: {e}", reason="storage_down", retry_after_ms=1000) from e
            t1 = time.perf_counter()
            timings["fetch"] += t1 - t0
            size = tmp.stat().st_size
            if size != f.size:
                tmp.unlink(missing_ok=True)
                raise IntegrityError(
                    f"{self._name(m)}: file {f.path!r} is {size} bytes, the manifest says {f.size} (truncated or substituted)",
                    reason="integrity",
                )
            digest = _sha256(tmp)
            timings["verify"] += time.perf_counter() - t1
            if digest != f.sha256:
                tmp.unlink(missing_ok=True)
                raise IntegrityError(
                    f"{self._name(m)}: file {f.path!r} has sha256 {digest[:16]}..., the manifest says {f.sha256[:16]}... (corrupt or substituted)",
                    reason="integrity",
                )
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, dest)
            marker.write_text(f.sha256)
        return d

    def load(self, m: ModelManifest) -> LoadResult:
        timings: dict[str, float] = {}
        d = self.fetch(m, timings)
        prepare_runtime(m.format)
        with self._lock:
            before = self.probe.used()
            t1 = time.perf_counter()
            try:
                model = load_model(d / m.model_file, m, self.device)
            except RuntimeLoadError as e:
                raise LoadFailed(f"{self._name(m)}: {e}", reason="load_failed") from e
            t2 = time.perf_counter()
            try:
                model.run(warmup_inputs(m), [o.name for o in m.outputs])
            except Exception as e:  # noqa: BLE001 - a model that cannot run zeros is not served
                model.close()
                raise LoadFailed(f"{self._name(m)}: warm-up inference failed: {type(e).__name__}: {e}", reason="warmup_failed") from e
            t3 = time.perf_counter()
            after = self.probe.used()
        timings["deserialize"] = t2 - t1
        timings["warmup"] = t3 - t2
        delta = max(0, after - before)
        floor = m.total_bytes // 4
        measured = delta >= floor
        return LoadResult(model, delta if measured else max(delta, m.total_bytes), measured, timings)
