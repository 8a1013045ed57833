"""Loading one model version through the tiers: host RAM (bytes) <- local disk (verified files) <- storage.

Every file fetched from storage is checked for size and sha256 before anything is deserialized; then the
runtime session is built, warmed up on zeros, and the memory it really took is measured. Runs in a worker
thread, one load at a time per device, so the memory measured around a load belongs to that load alone.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hostd.cache.tiers import DiskTier, RamTier
from ground.errors import Unavailable
from hostd.memory import CpuProbe, MemoryProbe, release_free_memory
from hostd.runtimes.base import DeviceSpec, LoadedModel, RuntimeLoadError
from hostd.runtimes.registry import load_model, prepare_runtime
from ground.manifest import DATATYPES, ModelManifest
from storage_adapters.base import ObjectNotFound, Storage, StorageError
from catalog.repository import ModelRepository

log = logging.getLogger(__name__)
_CHUNK = 1 << 20


class IntegrityError(Unavailable):
    """A fetched file does not match its manifest (corrupt, truncated or substituted)."""


class LoadFailed(Unavailable):
    pass


@dataclass
class LoadResult:
    model: LoadedModel
    memory_delta: int  # what the probe saw change across deserialize + warm-up
    memory_plausible: bool  # the delta is at least half the model's file bytes (weights must live somewhere)
    source_tier: str  # "ram", "disk" or "storage": where the bytes came from
    timings: dict[str, float] = field(default_factory=dict)
    # seconds outside the phases: "lock_wait" (for the loader's lock: one deserialize at a time per host) and
    # "locked" (holding it: deserialize, warm-up and the memory probes around them)
    waits: dict[str, float] = field(default_factory=dict)


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


def _name(m: ModelManifest) -> str:
    return f"model {m.model!r} version {m.version!r}"


def _stamp(path: Path, sha256: str) -> str:
    """What the disk tier's `.sha256` marker holds for a verified file: the digest plus the file's inode,
    size and modification time when it was verified. A file changed or replaced since (any of those differ)
    is fetched and verified again instead of being trusted: the tier re-hashes whatever it did not verify."""
    st = path.stat()
    return f"{sha256} {st.st_ino} {st.st_size} {st.st_mtime_ns}"


def _verified(path: Path, sha256: str) -> bool:
    marker = path.with_name(path.name + ".sha256")
    try:
        return marker.read_text() == _stamp(path, sha256)
    except OSError:
        return False


class LoadProgress:
    """How far a load has come, written by the loading thread and read by the event loop: its phase and
    when bytes last arrived from storage. A fetch whose bytes stop coming for longer than the stall bound
    is storage that hangs: requests waiting on that load are answered UNAVAILABLE (storage_down) instead of
    waiting out their whole deadline, while the fetch itself runs on until the store's own timeouts end it."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self.fetching = False
        self.last = clock()

    def start_fetch(self) -> None:
        self.last = self._clock()
        self.fetching = True

    def tick(self, _n: int = 0) -> None:
        self.last = self._clock()

    def end_fetch(self) -> None:
        self.fetching = False

    def stalled(self, now: float, bound_s: float) -> bool:
        return self.fetching and now - self.last > bound_s


class Loader:
    def __init__(self, storage: Storage, disk: DiskTier, ram: RamTier | None, device: DeviceSpec, probe: MemoryProbe) -> None:
        self.storage = storage
        self.disk = disk
        self.ram = ram
        self.device = device
        self.probe = probe
        self._lock = threading.Lock()

    def fetch(self, m: ModelManifest, timings: dict[str, float] | None = None,
              progress: LoadProgress | None = None) -> Path:
        """Every file of the version on local disk, verified. Adds seconds spent downloading ('fetch') and
        hashing ('verify') to `timings`; `progress` hears of every chunk that arrives."""
        timings = timings if timings is not None else {}
        timings.setdefault("fetch", 0.0)
        timings.setdefault("verify", 0.0)
        key = m.key()
        d = self.disk.path(key)
        self.disk.make_room(m.total_bytes)
        d.mkdir(parents=True, exist_ok=True)
        for f in m.files:
            dest = d / f.path
            marker = dest.with_name(dest.name + ".sha256")
            if dest.is_file() and _verified(dest, f.sha256):
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(f".part-{dest.name}-{os.getpid()}-{threading.get_ident()}")
            t0 = time.perf_counter()
            try:
                if progress is not None:
                    progress.start_fetch()
                try:
                    self.storage.download(ModelRepository.file_key(m, f.path), tmp, size_hint=f.size,
                                          progress=progress.tick if progress is not None else None)
                finally:
                    if progress is not None:
                        progress.end_fetch()
            except ObjectNotFound as e:
                tmp.unlink(missing_ok=True)
                raise LoadFailed(f"{_name(m)}: file {f.path!r} is missing from storage", reason="missing_file",
                                 detail=str(e)) from e
            except StorageError as e:
                tmp.unlink(missing_ok=True)
                raise Unavailable(f"{_name(m)}: model storage is unavailable; retry later", reason="storage_down",
                                  retry_after_ms=1000, detail=str(e)) from e
            t1 = time.perf_counter()
            timings["fetch"] += t1 - t0
            size = tmp.stat().st_size
            if size != f.size:
                tmp.unlink(missing_ok=True)
                raise IntegrityError(
                    f"{_name(m)}: file {f.path!r} is {size} bytes, the manifest says {f.size} (truncated or substituted)",
                    reason="integrity",
                )
            digest = _sha256(tmp)
            timings["verify"] += time.perf_counter() - t1
            if digest != f.sha256:
                tmp.unlink(missing_ok=True)
                raise IntegrityError(
                    f"{_name(m)}: file {f.path!r} has sha256 {digest[:16]}..., the manifest says "
                    f"{f.sha256[:16]}... (corrupt or substituted)",
                    reason="integrity",
                )
            os.replace(tmp, dest)
            marker.write_text(_stamp(dest, f.sha256))
        self.disk.added(key, m.total_bytes)
        return d

    def _source(self, m: ModelManifest, timings: dict[str, float],
                progress: LoadProgress | None = None) -> tuple[Path | bytes, str]:
        """The model file's bytes from the RAM tier (single-file models), else its verified path on disk."""
        key = m.key()
        if self.ram is not None and len(m.files) == 1:
            blobs = self.ram.get(key)
            if blobs is not None:
                return blobs[m.model_file], "ram"
        self.disk.hold(key)
        try:
            tier = "disk" if self.disk.lookup(key) and self._on_disk(m) else "storage"
            return self.fetch(m, timings, progress) / m.model_file, tier
        finally:
            self.disk.release(key)

    def remember(self, m: ModelManifest) -> None:
        """Copy a loaded model's verified file into the RAM tier, so that the next reload is a memory copy.
        Called after the load, off the request's critical path."""
        key = m.key()
        if self.ram is None or len(m.files) != 1 or key in self.ram:
            return
        self.disk.hold(key)
        try:
            if self._on_disk(m):
                self.ram.put(key, {m.model_file: (self.disk.path(key) / m.model_file).read_bytes()})
        finally:
            self.disk.release(key)

    def _on_disk(self, m: ModelManifest) -> bool:
        d = self.disk.path(m.key())
        for f in m.files:
            p = d / f.path
            if not (p.is_file() and _verified(p, f.sha256)):
                return False
        return True

    def load(self, m: ModelManifest, progress: LoadProgress | None = None) -> LoadResult:
        timings: dict[str, float] = {}
        source, tier = self._source(m, timings, progress)
        prepare_runtime(m.format, self.device)
        cpu = isinstance(self.probe, CpuProbe)
        t_ask = time.perf_counter()
        with self._lock:
            t_got = time.perf_counter()
            if cpu:
                release_free_memory()
            before = self.probe.used()
            t1 = time.perf_counter()
            try:
                model = load_model(source, m, self.device)
            except RuntimeLoadError as e:
                if self.ram is not None:
                    self.ram.discard(m.key())
                raise LoadFailed(f"{_name(m)}: {e}", reason="load_failed") from e
            t2 = time.perf_counter()
            try:
                model.run(warmup_inputs(m), [o.name for o in m.outputs])
            except Exception as e:  # noqa: BLE001 - a model that cannot run zeros is not served
                model.close()
                raise LoadFailed(f"{_name(m)}: warm-up inference failed: {type(e).__name__}: {e}", reason="warmup_failed") from e
            t3 = time.perf_counter()
            if cpu:
                release_free_memory()  # drop the load's temporaries so only what stays is counted
            after = self.probe.used()
            t_out = time.perf_counter()
        timings["deserialize"] = t2 - t1
        timings["warmup"] = t3 - t2
        delta = max(0, after - before)
        if cpu:  # in host memory the weights are at least their file's size; RSS noise cannot go below it
            delta = max(delta, m.total_bytes)
        return LoadResult(model, delta, delta >= m.total_bytes // 2, tier, timings,
                          {"lock_wait": t_got - t_ask, "locked": t_out - t_got})
