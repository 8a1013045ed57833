"""Loading one model version through the tiers: host RAM (bytes) <- local disk (verified files) <- storage.

Every file fetched from storage is checked for size and sha256 before anything is deserialized; then the
runtime session is built, warmed up on zeros, and the memory it really took is measured. Runs in a worker
thread, one load at a time per device, so the memory measured around a load belongs to that load alone.

A cold load of a single-file model reads the object straight into memory, hashing each chunk as it arrives,
and builds the session from those bytes; the RAM tier keeps the same bytes, and the disk tier's copy is
written in the background. Runtimes that can (ONNX) then save the optimized graph into the disk tier's graph
cache (hostd/cache/graphs.py), also in the background; reloads from disk use it, and the RAM tier holds it
once it was filled from a disk load.

A reload (a version loaded here before, whose memory is known) of an ONNX model on CPU answers before its
weights are prepacked for the kernels, and they are prepacked right after, still under the loader's lock
(ONNX Runtime's prepacking was ~50 of the ~55 ms a 50 MB MLP's session took to build; hostd/runtimes/onnx.py).
A first load is whole before it answers: its probes must see all the memory the model takes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import mmap
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hostd.cache.graphs import GraphCache, GraphId
from hostd.cache.stamps import marker, sha256_file, stamp, verified
from hostd.cache.tiers import DiskTier, RamTier
from ground.errors import Unavailable
from hostd.memory import CpuProbe, MemoryProbe, release_free_memory
from hostd.runtimes.base import DeviceSpec, LoadedModel, ModelSource, RuntimeLoadError, GraphSource, warmup_inputs
from hostd.runtimes.onnx import GRAPH_FILE, WEIGHTS_FILE  # the one runtime with saved graphs
from hostd.runtimes.registry import graph_saver, load_model, prepare_runtime
from ground.manifest import FileEntry, ModelManifest
from storage_adapters.base import ObjectNotFound, Storage, StorageError
from catalog.repository import ModelRepository

log = logging.getLogger(__name__)
_CHUNK = 1 << 20
# RAM tier entries of a graph with its weights apart: saved optimized (graph cache) or split from the file
_SAVED = (".saved/graph", ".saved/weights")
_SPLIT = (".split/graph", ".split/weights")
Pieces = Callable[[], Iterator[memoryview]]  # a model file's bytes, in pieces


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
    saved_graph: bool | None = None  # loaded from the graph cache; None: the runtime has none
    # seconds outside the phases: "lock_wait" (for the loader's lock: one deserialize at a time per host) and
    # "locked" (holding it: deserialize, warm-up and the memory probes around them)
    waits: dict[str, float] = field(default_factory=dict)


def _name(m: ModelManifest) -> str:
    return f"model {m.model!r} version {m.version!r}"


def _wrong_size(m: ModelManifest, f: FileEntry, size: int) -> IntegrityError:
    return IntegrityError(f"{_name(m)}: file {f.path!r} is {size} bytes, the manifest says {f.size} "
                          "(truncated or substituted)", reason="integrity")


def _wrong_digest(m: ModelManifest, f: FileEntry, digest: str) -> IntegrityError:
    return IntegrityError(f"{_name(m)}: file {f.path!r} has sha256 {digest[:16]}..., the manifest says "
                          f"{f.sha256[:16]}... (corrupt or substituted)", reason="integrity")


# The disk tier's `.sha256` marker of a verified file holds the digest plus the file's inode, size and
# modification time when it was verified (hostd/cache/stamps.py). A file changed or replaced since (any of
# those differ) is fetched and verified again instead of being trusted.
_stamp = stamp
_verified = verified


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


def landing(size: int) -> memoryview:
    """`size` bytes to read a file into, every page mapped before the first byte arrives (Linux MAP_POPULATE:
    one kernel call, instead of a page fault per 4 KiB while the bytes come in; those took 7-130 ms per 50 MB
    on a 2-core VM, the fetch phase's spread in bench/cold_start.py). Elsewhere numpy's uninitialized array
    (bytearray(n) would zero it first)."""
    populate = getattr(mmap, "MAP_POPULATE", 0)
    if size > 0 and populate:
        return memoryview(mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | populate))
    return memoryview(np.empty(size, dtype=np.uint8))


class Loader:
    def __init__(self, storage: Storage, disk: DiskTier, ram: RamTier | None, device: DeviceSpec, probe: MemoryProbe,
                 background: Executor | None = None, upgrades: Executor | None = None,
                 on_phase: Callable[[str, float], None] | None = None) -> None:
        """`background`: the disk tier's writes and saved graphs (lowest priority); `upgrades`: what a load
        deferred (model.upgrade), at the priority of loads, since it holds the loader's lock; `on_phase`:
        told (phase, seconds) of the work done after a load returned ("prepack")."""
        self.storage = storage
        self.disk = disk
        self.ram = ram
        self.device = device
        self.probe = probe
        self.graphs = GraphCache(disk, GRAPH_FILE)
        self._lock = threading.Lock()
        # one thread for the disk tier's writes and saved graphs: never on a request's path
        self._background = background or ThreadPoolExecutor(1, thread_name_prefix="tier-write")
        self._writes: dict[tuple[str, str, str], Future] = {}
        self._writes_lock = threading.Lock()
        self._upgrades = upgrades or ThreadPoolExecutor(1, thread_name_prefix="upgrade")
        self._upgrading: set[Future] = set()  # upgrades queued or running; under _writes_lock, as _writes is
        self._on_phase = on_phase

    # ---- storage ---------------------------------------------------------------------------------
    def _storage_failed(self, m: ModelManifest, path: str, e: StorageError) -> Unavailable:
        if isinstance(e, ObjectNotFound):
            return LoadFailed(f"{_name(m)}: file {path!r} is missing from storage", reason="missing_file",
                              detail=str(e))
        return Unavailable(f"{_name(m)}: model storage is unavailable; retry later", reason="storage_down",
                           retry_after_ms=1000, detail=str(e))

    def _download(self, m: ModelManifest, f: FileEntry, timings: dict[str, float],
                  progress: LoadProgress | None) -> memoryview:
        """One file from storage into memory, hashed chunk by chunk as it arrives; its bytes once they
        match the manifest's size and sha256, else IntegrityError (and nothing kept)."""
        h = hashlib.sha256()
        hashed = 0
        hashing = 0.0

        def ready(end: int) -> None:
            nonlocal hashed, hashing
            t = time.perf_counter()
            h.update(view[hashed:end])
            hashed = end
            hashing += time.perf_counter() - t

        t0 = time.perf_counter()
        view = landing(f.size)  # in the fetch phase: mapping its pages is part of what a download costs
        if progress is not None:
            progress.start_fetch()
        try:
            size = self.storage.read_into(ModelRepository.file_key(m, f.path), view,
                                          progress=progress.tick if progress is not None else None, ready=ready)
        except StorageError as e:
            raise self._storage_failed(m, f.path, e) from e
        finally:
            if progress is not None:
                progress.end_fetch()
        timings["fetch"] = timings.get("fetch", 0.0) + time.perf_counter() - t0 - hashing
        timings["verify"] = timings.get("verify", 0.0) + hashing
        if size != f.size or hashed != f.size:
            raise _wrong_size(m, f, size)
        digest = h.hexdigest()
        if digest != f.sha256:
            raise _wrong_digest(m, f, digest)
        return view

    def fetch(self, m: ModelManifest, timings: dict[str, float] | None = None,
              progress: LoadProgress | None = None) -> Path:
        """Every file of the version on local disk, verified. Adds seconds spent downloading ('fetch') and
        hashing ('verify') to `timings`; `progress` hears of every chunk that arrives."""
        timings = timings if timings is not None else {}
        timings.setdefault("fetch", 0.0)
        timings.setdefault("verify", 0.0)
        key = m.key()
        self._wait_written(key)
        d = self.disk.path(key)
        self.disk.make_room(m.total_bytes)
        d.mkdir(parents=True, exist_ok=True)
        for f in m.files:
            dest = d / f.path
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
            except StorageError as e:
                tmp.unlink(missing_ok=True)
                raise self._storage_failed(m, f.path, e) from e
            t1 = time.perf_counter()
            timings["fetch"] += t1 - t0
            size = tmp.stat().st_size
            if size != f.size:
                tmp.unlink(missing_ok=True)
                raise _wrong_size(m, f, size)
            digest = sha256_file(tmp)
            timings["verify"] += time.perf_counter() - t1
            if digest != f.sha256:
                tmp.unlink(missing_ok=True)
                raise _wrong_digest(m, f, digest)
            os.replace(tmp, dest)
            marker(dest).write_text(_stamp(dest, f.sha256))
        self.disk.added(key, m.total_bytes)
        return d

    # ---- the disk tier, written in the background ------------------------------------------------
    def _pending_write(self, key: tuple[str, str, str]) -> None:
        """A write of this version is coming (its load is under way): loads that need the disk wait for it,
        and the version is held against eviction until it is written."""
        self.disk.hold(key)
        with self._writes_lock:
            self._writes[key] = Future()

    def _write_later(self, m: ModelManifest, data: Pieces) -> None:
        """The verified bytes of a single-file model into the disk tier, off the load's path."""
        key = m.key()
        with self._writes_lock:
            pending = self._writes.get(key)
            fut = self._background.submit(self._write, m, data)
            self._writes[key] = fut

        def done(f: Future) -> None:
            self.disk.release(key)
            with self._writes_lock:
                if self._writes.get(key) is f:
                    del self._writes[key]
            if pending is not None:
                pending.set_result(None)
            if not f.cancelled() and f.exception() is not None:
                log.warning("disk tier: writing %s failed: %s", _name(m), f.exception())

        fut.add_done_callback(done)

    def _write(self, m: ModelManifest, data: Pieces) -> None:
        """Hashed again on the way out: the bytes may have been rearranged for loading since they were
        verified, and only the exact file the manifest names is stamped."""
        key = m.key()
        f = m.files[0]
        d = self.disk.path(key)
        self.disk.make_room(m.total_bytes)
        dest = d / f.path
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".part-{dest.name}-{os.getpid()}-{threading.get_ident()}")
        h = hashlib.sha256()
        try:
            with open(tmp, "wb") as out:
                for piece in data():
                    h.update(piece)
                    out.write(piece)
            if h.hexdigest() != f.sha256:
                raise IntegrityError(f"{_name(m)}: the bytes to write to the disk tier do not match the manifest",
                                     reason="integrity")
            os.replace(tmp, dest)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        marker(dest).write_text(_stamp(dest, f.sha256))
        self.disk.added(key, m.total_bytes)

    def _wait_written(self, key: tuple[str, str, str]) -> None:
        with self._writes_lock:
            fut = self._writes.get(key)
        if fut is not None:
            try:
                fut.result()
            except Exception:  # noqa: BLE001 - logged by its callback; the disk simply does not have it
                pass

    def flush(self) -> None:
        """Wait for the background writes and deferred upgrades queued so far (tests, shutdown)."""
        with self._writes_lock:
            upgrading = list(self._upgrading)
        wait(upgrading)
        self._background.submit(lambda: None).result()

    def _upgrade_later(self, m: ModelManifest, model: LoadedModel) -> None:
        """What the runtime deferred (prepacking), on the upgrades executor and under the loader's lock, so
        that no load's memory probes see it. Until it is done the model answers on its first session."""
        def upgrade() -> None:
            with self._lock:
                t0 = time.perf_counter()
                model.upgrade()
                took = time.perf_counter() - t0
            if self._on_phase is not None:
                self._on_phase("prepack", took)
            log.info("%s: weights prepacked in the background in %.0f ms", _name(m), took * 1e3)

        def done(f: Future) -> None:
            with self._writes_lock:
                self._upgrading.discard(f)
            if not f.cancelled() and f.exception() is not None:
                log.warning("%s: prepacking its weights failed; it goes on answering unpacked: %s", _name(m),
                            f.exception())

        try:
            fut = self._upgrades.submit(upgrade)
        except RuntimeError:  # shutting down: the model answers unpacked until it is closed
            return
        with self._writes_lock:
            self._upgrading.add(fut)
        fut.add_done_callback(done)

    # ---- saved graphs ----------------------------------------------------------------------------
    def _graph_id(self, m: ModelManifest) -> GraphId | None:
        saver = graph_saver(m.format)
        if saver is None or len(m.files) != 1:
            return None
        return GraphId(m.files[0].sha256, saver.key(self.device))

    def _save_graph_later(self, m: ModelManifest) -> None:
        """Once the model file is on disk, have the runtime save its optimized graph (background)."""
        gid = self._graph_id(m)
        saver = graph_saver(m.format)
        if gid is None or saver is None:
            return
        key = m.key()

        def save() -> None:
            self.disk.hold(key)
            try:
                model_file = self.disk.path(key) / m.model_file
                if not (self._on_disk(m) and self.graphs.find(key, gid) is None):
                    return
                self.disk.make_room(m.total_bytes)
                n = self.graphs.save(key, gid, lambda dest: saver.save(model_file, self.device, dest))
                log.info("graph cache: saved %s for %s (%.1f MB)", gid.runtime, _name(m), n / 1e6)
            finally:
                self.disk.release(key)

        fut = self._background.submit(save)
        fut.add_done_callback(lambda f: f.cancelled() or f.exception() is None
                              or log.warning("graph cache: saving %s failed: %s", _name(m), f.exception()))

    # ---- where a load's bytes come from ----------------------------------------------------------
    def _from_ram(self, m: ModelManifest, blobs: dict[str, bytes], plain: bool) -> ModelSource | None:
        for (graph, weights), optimized in ((_SAVED, True), (_SPLIT, False)):
            if graph in blobs:
                return None if plain else GraphSource(blobs[graph], blobs[weights], optimized=optimized)
        return blobs[m.model_file]

    def _split(self, m: ModelManifest, data: memoryview) -> tuple[ModelSource, dict[str, bytes], Pieces]:
        """Verified bytes made ready to load where the runtime can (weights read in place): what to load,
        what the RAM tier keeps, and the original file in pieces."""
        saver = graph_saver(m.format)
        done = saver.split(data) if saver is not None else None
        if done is None:
            return data, {m.model_file: data}, lambda: iter((data,))  # type: ignore[dict-item]
        source, pieces = done
        return source, {_SPLIT[0]: source.graph, _SPLIT[1]: data}, pieces  # type: ignore[dict-item]

    def _source(self, m: ModelManifest, timings: dict[str, float], progress: LoadProgress | None = None,
                plain: bool = False) -> tuple[ModelSource, str, Pieces | None]:
        """The model from the RAM tier (single-file models), else from the disk tier (its saved graph when
        there is one), else read from storage into memory (single-file models) or onto disk. `plain`: only
        the model file as it is (after a saved or split graph failed to load). With bytes read into memory,
        the file's bytes in pieces, for the disk tier once the load is done."""
        key = m.key()
        single = len(m.files) == 1
        if self.ram is not None and single:
            blobs = self.ram.get(key)
            if blobs is not None and (ram := self._from_ram(m, blobs, plain)) is not None:
                return ram, "ram", None
        self._wait_written(key)
        self.disk.hold(key)
        try:
            if self.disk.lookup(key) and self._on_disk(m):
                gid = None if plain else self._graph_id(m)
                graph = self.graphs.find(key, gid) if gid is not None else None
                if graph is not None:
                    return GraphSource(graph), "disk", None
                return self.disk.path(key) / m.model_file, "disk", None
            if not single:
                return self.fetch(m, timings, progress) / m.model_file, "storage", None
            data = self._download(m, m.files[0], timings, progress)
        finally:
            self.disk.release(key)
        if plain:
            source: ModelSource = data
            blobs, pieces = {m.model_file: data}, lambda: iter((data,))
        else:
            t = time.perf_counter()
            source, blobs, pieces = self._split(m, data)
            timings["prepare"] = time.perf_counter() - t  # the weights moved into alignment
        if self.ram is not None:
            self.ram.put(key, blobs)  # type: ignore[arg-type]  # bytes-like, never written again
        if isinstance(source, GraphSource) and (self.ram is None or key not in self.ram):
            # no tier keeps the buffer: the session copies the weights, so the buffer goes after the write
            source = dataclasses.replace(source, in_place=False)
        self._pending_write(key)
        return source, "storage", pieces

    def remember(self, m: ModelManifest) -> None:
        """Copy a loaded model's saved graph, or its verified file made ready to load, into the RAM tier, so
        that the next reload is a memory copy. Called after the load, off the request's critical path."""
        key = m.key()
        if self.ram is None or len(m.files) != 1 or key in self.ram:
            return
        self.disk.hold(key)
        try:
            if self._on_disk(m):
                gid = self._graph_id(m)
                graph = self.graphs.find(key, gid) if gid is not None else None
                if graph is not None:
                    files = self.graphs.read(graph)
                    self.ram.put(key, {_SAVED[0]: files[GRAPH_FILE], _SAVED[1]: files[WEIGHTS_FILE]})
                else:
                    path = self.disk.path(key) / m.model_file
                    data = landing(m.total_bytes)
                    with open(path, "rb") as f:
                        f.readinto(data)
                    self.ram.put(key, self._split(m, data)[1])
        finally:
            self.disk.release(key)

    def _on_disk(self, m: ModelManifest) -> bool:
        d = self.disk.path(m.key())
        for f in m.files:
            p = d / f.path
            if not (p.is_file() and _verified(p, f.sha256)):
                return False
        return True

    def _discard_graph(self, m: ModelManifest, tier: str, source: GraphSource, err: Exception) -> None:
        key = m.key()
        gid = self._graph_id(m)
        log.warning("%s: the %s graph (%s tier) does not load (%s); loading the model file as it is", _name(m),
                    "saved" if source.optimized else "split", tier, err)
        if self.ram is not None:
            self.ram.discard(key)
        if gid is not None and source.optimized:
            self.disk.hold(key)
            try:
                self.graphs.discard(key, gid)
            finally:
                self.disk.release(key)

    def _load_failed(self, m: ModelManifest, e: RuntimeLoadError) -> LoadFailed:
        if self.ram is not None:
            self.ram.discard(m.key())
        return LoadFailed(f"{_name(m)}: {e}", reason="load_failed")

    def _deserialize(self, m: ModelManifest, source: ModelSource, cpu: bool, waits: dict[str, float],
                     defer: bool = False) -> tuple[LoadedModel, int, float, float]:
        """Under the loader's lock: the model built and warmed up, and the memory the probe saw it take:
        (model, bytes, deserialize s, warm-up s). The runtime's RuntimeLoadError passes through. `defer`:
        the runtime may leave prepacking to model.upgrade (load_model's defer_prepack)."""
        t_ask = time.perf_counter()
        with self._lock:
            t_got = time.perf_counter()
            waits["lock_wait"] += t_got - t_ask
            try:
                if cpu:
                    release_free_memory()
                before = self.probe.used()
                t1 = time.perf_counter()
                model = load_model(source, m, self.device, defer_prepack=defer)
                t2 = time.perf_counter()
                try:
                    model.run(warmup_inputs(m.inputs), [o.name for o in m.outputs])
                except Exception as e:  # noqa: BLE001 - a model that cannot run zeros is not served
                    model.close()
                    raise LoadFailed(f"{_name(m)}: warm-up inference failed: {type(e).__name__}: {e}",
                                     reason="warmup_failed") from e
                t3 = time.perf_counter()
                if cpu:
                    release_free_memory()  # drop the load's temporaries so only what stays is counted
                after = self.probe.used()
            finally:
                waits["locked"] += time.perf_counter() - t_got
        return model, max(0, after - before), t2 - t1, t3 - t2

    def load(self, m: ModelManifest, progress: LoadProgress | None = None, reserve_bytes: int = 0) -> LoadResult:
        """`reserve_bytes`: the memory this version took when it was last loaded here, room for which the
        caller has made (0: never loaded). With it, a runtime that can answers first and prepacks its weights
        in the background (OnnxModel's defer_prepack), and the load counts that memory, since the packed
        weights arrive after the probes; without it the load is whole before it returns, so that what is
        measured is all the model takes."""
        timings: dict[str, float] = {}
        defer = reserve_bytes > 0
        # seconds waiting for the loader's lock (one deserialize at a time per host) and holding it
        waits = {"lock_wait": 0.0, "locked": 0.0}
        source, tier, pieces = self._source(m, timings, progress)
        try:
            prepare_runtime(m.format, self.device)
            cpu = isinstance(self.probe, CpuProbe)
            try:
                model, delta, timings["deserialize"], timings["warmup"] = self._deserialize(m, source, cpu, waits, defer)
            except RuntimeLoadError as e:
                if not isinstance(source, GraphSource):
                    raise self._load_failed(m, e) from e
                # a saved or split graph that does not load is the cache's fault, not the model's: the file as
                # it is, found outside the lock (it may wait for the disk tier's write below, or read storage)
                self._discard_graph(m, tier, source, e)
                if pieces is not None:  # verified bytes: the disk tier has them for this second try
                    self._write_later(m, pieces)
                    pieces = None
                source, tier, pieces = self._source(m, timings, progress, plain=True)
                try:
                    model, delta, timings["deserialize"], timings["warmup"] = self._deserialize(m, source, cpu, waits,
                                                                                                defer)
                except RuntimeLoadError as e2:
                    raise self._load_failed(m, e2) from e2
        finally:
            if pieces is not None:  # the disk tier's copy of verified bytes, once the load is done with the cores
                self._write_later(m, pieces)
        if model.kept_bytes and (self.ram is None or m.key() not in self.ram):
            delta += model.kept_bytes  # the session reads weights in place from bytes no tier accounts for
        if cpu:  # in host memory the weights are at least their file's size; RSS noise cannot go below it
            delta = max(delta, m.total_bytes)
        if model.upgrade_pending:  # what it took last time, prepacked weights included
            delta = max(delta, reserve_bytes)
            self._upgrade_later(m, model)
        gid = self._graph_id(m)
        saved = None if gid is None else isinstance(source, GraphSource) and source.optimized
        if gid is not None and not saved:
            self._save_graph_later(m)  # after the write (one background thread, in order)
        return LoadResult(model, delta, delta >= m.total_bytes // 2, tier, timings, saved, waits)
