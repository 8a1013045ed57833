"""ONNX Runtime: the CUDA execution provider when a GPU is present and selected, else CPU."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np

from hostd.runtimes.base import DeviceSpec, LoadedModel, ModelSource, RuntimeLoadError, GraphSource
from hostd.runtimes.onnx_split import split_in_place
from ground.manifest import ModelManifest, TensorSpec

log = logging.getLogger(__name__)

_ORT_TO_V2 = {
    "tensor(float)": "FP32",
    "tensor(float16)": "FP16",
    "tensor(double)": "FP64",
    "tensor(int64)": "INT64",
    "tensor(int32)": "INT32",
    "tensor(int16)": "INT16",
    "tensor(int8)": "INT8",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(bool)": "BOOL",
    "tensor(string)": "BYTES",
}


def _providers(device: DeviceSpec) -> list:
    import onnxruntime as ort

    if device.kind == "cuda":
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise RuntimeLoadError("CUDA requested but this onnxruntime has no CUDAExecutionProvider")
        return [("CUDAExecutionProvider", {"device_id": device.index}), "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


_SPLIT_WEIGHTS = "model.weights"  # the name a graph split from the model's bytes gives their buffer
GRAPH_FILE = "graph.onnx"
WEIGHTS_FILE = "weights.bin"  # a saved graph's weights (on disk beside GRAPH_FILE, or that file's bytes)
# Saved graphs are optimized up to EXTENDED (fusions, constant folding); ORT advises against saving the ALL
# level's layout changes, which depend on the CPU. They load with optimization off.
_SAVE_LEVEL = "ORT_ENABLE_EXTENDED"


def graph_cache_key(device: DeviceSpec) -> str:
    """What a saved graph depends on beyond the model's bytes: ONNX Runtime's version and the provider."""
    import onnxruntime as ort

    return f"ort{ort.__version__}-{device.kind}"


def split_model(buf: memoryview) -> tuple[GraphSource, Callable[[], Iterator[memoryview]]] | None:
    """Verified model bytes made ready to load in place (hostd/runtimes/onnx_split.py): the source, and the
    original file's bytes in pieces (the buffer is rearranged). None when the file cannot be split."""
    split = split_in_place(buf, _SPLIT_WEIGHTS)
    if split is None:
        return None
    return GraphSource(split.graph, buf, optimized=False), lambda: split.original(buf)


def _options(device: DeviceSpec):
    import onnxruntime as ort

    so = ort.SessionOptions()
    # hostd passes the plan's threads (hostd/core/sizing.py: slots x threads <= cores); 0 = ORT's default
    # (one per physical core), which oversubscribes the cores as soon as two batches run at once.
    # On CUDA each session runs on a compute stream of its own (the CUDA provider's default), so batches of
    # different models overlap on the device; runs of one session (its instances) share its stream.
    if device.ort_intra_op_threads:
        so.intra_op_num_threads = device.ort_intra_op_threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    # Spinning intra-op threads burn cores that the event loop and other models need between runs.
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if device.ort_spinning else "0")
    return so


def _in_memory(so, name: str, buf: bytes | bytearray | memoryview, in_place: bool = True) -> None:
    """`buf` as the weights file `name`. In place: aligned weights are read where they lie (no copy) and
    the session keeps pointers into it, so it must live as long as the session; else they are copied."""
    so.add_external_initializers_from_files_in_memory([name], [buf], [len(buf)])
    if in_place:
        so.add_session_config_entry("session.use_external_initializer_file_buffers_directly", "1")


def _session(source: ModelSource, device: DeviceSpec, so=None, prepack: bool = True):
    """An InferenceSession, and the buffer it reads weights from in place (to keep alive with it), if any.
    `prepack=False`: the CPU kernels use the weights as they lie instead of repacking them for their GEMMs
    first (a session in 1-2 ms instead of ~50 for a 50 MB MLP; batches of 32 then take 1.7-2.5x longer)."""
    import onnxruntime as ort

    so = so if so is not None else _options(device)
    if not prepack:
        so.add_session_config_entry("session.disable_prepacking", "1")
    kept: bytes | bytearray | memoryview | None = None
    model: str | bytes
    if isinstance(source, GraphSource):
        if source.optimized:
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        if isinstance(source.graph, Path):
            model = str(source.graph)  # the weights file beside it is mapped, not read
        else:
            if source.weights is None:
                raise RuntimeLoadError("a graph in memory comes with its weights")
            _in_memory(so, WEIGHTS_FILE if source.optimized else _SPLIT_WEIGHTS, source.weights, source.in_place)
            model, kept = source.graph, (source.weights if source.in_place else None)
    elif isinstance(source, (bytes, bytearray, memoryview)):
        # the file as it is: splitting its weights out is the loader's decision (split_model), and its
        # fallback after a split graph failed to load must not split again
        model = bytes(source)
    else:
        model = str(source)
    try:
        return ort.InferenceSession(model, so, providers=_providers(device)), kept
    except RuntimeLoadError:
        raise
    except Exception as e:  # ORT raises its own exception types for corrupt graphs
        raise RuntimeLoadError(f"onnxruntime could not load the model: {e}") from e


def _in_place(source: ModelSource) -> bool:
    """A graph whose weights a session reads where they lie (mapped from the disk tier, or a buffer a cache
    tier owns): a second session over it costs no second copy of them."""
    return isinstance(source, GraphSource) and (isinstance(source.graph, Path) or source.in_place)


def _wide_session(source: ModelSource, device: DeviceSpec, prepack: bool = False):
    """The model's second session, on `device.ort_wide_threads` threads, for lone batches of one request
    (hostd/core/dispatch.py), or None. Only over weights it reads where they lie (a graph with its weights
    apart, in memory in place or mapped from the disk tier), and by default without prepacking them, so that
    it costs no second copy of the weights (50 MB MLP: +3 MB; prepacked, +56 MB); batch 1 on 2 threads unpacked
    took 1.73-1.98 ms against 1.53-1.68 prepacked and 2.55-2.75 on one thread (one run each, busy 2-core box).
    `prepack` (the setting wide_prepacked): the second copy, for the faster lone batches."""
    if not _in_place(source):
        return None
    wide = replace(device, ort_intra_op_threads=device.ort_wide_threads)
    try:
        return _session(source, wide, prepack=prepack)[0]
    except RuntimeLoadError:  # the model still runs, on its plan's threads
        log.warning("no wide session for this model", exc_info=True)
        return None


def save_graph(source, device: DeviceSpec, dest: Path) -> None:
    """Optimize the model for `device` and write the result to `dest` (GRAPH_FILE, its weights in
    WEIGHTS_FILE): a throwaway session, run off any request's path."""
    import onnxruntime as ort

    so = _options(device)
    so.intra_op_num_threads = 1  # background work: one thread
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _SAVE_LEVEL)
    so.optimized_model_filepath = str(dest / GRAPH_FILE)
    so.add_session_config_entry("session.optimized_model_external_initializers_file_name", WEIGHTS_FILE)
    so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    sess, _ = _session(source, device, so)
    del sess


def prime(device: DeviceSpec) -> None:
    """Run one trivial graph on the device: ONNX Runtime's first session allocates its thread pools and
    arenas, a one-time cost that must not be counted as the first model's memory."""
    from onnx import TensorProto, helper

    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "prime",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    sess, _ = _session(m.SerializeToString(), device)
    sess.run(None, {"x": np.zeros((1, 4), np.float32)})
    del sess


def _dims(shape) -> list[int]:
    return [d if isinstance(d, int) and d >= 0 else -1 for d in shape]


def onnx_signature(path: Path) -> tuple[list[TensorSpec], list[TensorSpec]]:
    sess, _ = _session(path, DeviceSpec())

    def spec(a) -> TensorSpec:
        if a.type not in _ORT_TO_V2:
            raise RuntimeLoadError(f"tensor {a.name!r} has unsupported type {a.type}")
        return TensorSpec(name=a.name, datatype=_ORT_TO_V2[a.type], shape=_dims(a.shape))

    return [spec(a) for a in sess.get_inputs()], [spec(a) for a in sess.get_outputs()]


def _to_str(arr: np.ndarray) -> np.ndarray:
    """ORT string tensors hold UTF-8 str; v2 BYTES hold bytes (validated as UTF-8 in hostd/tensors.py)."""
    out = np.empty(arr.shape, dtype=object)
    out.flat[:] = [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in arr.flat]
    return out


def _to_bytes(arr: np.ndarray) -> np.ndarray:
    out = np.empty(arr.shape, dtype=object)
    out.flat[:] = [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in arr.flat]
    return out


class OnnxModel(LoadedModel):
    """`defer_prepack`: on CPU, over weights read in place, the model answers first on a session that does not
    prepack them, and `upgrade` (the loader calls it in the background) swaps in the prepacked one. A reload
    from the RAM or disk tier is then ready in a few ms instead of the ~50 ms prepacking takes (50 MB MLP); the
    batches run meanwhile are slower (1.7-2.5x at 32 rows), and the memory the packed weights take is known
    from the model's last load, for which room was made (hostd/loader.py)."""

    def __init__(self, source: ModelSource, manifest: ModelManifest, device: DeviceSpec,
                 defer_prepack: bool = False) -> None:
        self.device = device
        self._swap = threading.Lock()
        self._closed = False
        self._deferred = source if defer_prepack and device.kind == "cpu" and _in_place(source) else None
        self._sess, self._kept = _session(source, device, prepack=self._deferred is None)
        self.kept_bytes = len(self._kept) if self._kept is not None else 0
        self._output_names = [o.name for o in self._sess.get_outputs()]
        self._wide = None
        if device.kind == "cpu" and device.ort_wide_threads > max(1, device.ort_intra_op_threads):
            # with wide_prepacked, a deferred load packs this session's weights in `upgrade` too
            self._wide = _wide_session(source, device, prepack=device.ort_wide_prepacked and self._deferred is None)
        self.wide = self._wide is not None
        self._wide_unpacked = self.wide and device.ort_wide_prepacked and self._deferred is not None

    @property
    def upgrade_pending(self) -> bool:
        return self._deferred is not None

    def upgrade(self) -> None:
        """The prepacked session (and, with wide_prepacked, the wide one), built and swapped in; a batch
        running keeps the session it started on."""
        source = self._deferred
        if source is None:
            return
        sess, _ = _session(source, self.device)  # the same weights in place: `kept` is already held
        wide = _wide_session(source, self.device, prepack=True) if self._wide_unpacked else None
        with self._swap:
            if not self._closed:
                self._sess = sess
                if wide is not None:
                    self._wide, self._wide_unpacked = wide, False
                self._deferred = None

    def run(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        return self._run(self._sess, inputs, outputs)

    def run_wide(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        return self._run(self._wide or self._sess, inputs, outputs)

    def _run(self, sess, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        names = outputs or self._output_names
        feed = {k: (_to_str(v) if v.dtype == object else v) for k, v in inputs.items()}
        res = sess.run(names, feed)
        return {n: (_to_bytes(r) if r.dtype == object or r.dtype.kind == "U" else r) for n, r in zip(names, res, strict=True)}

    def close(self) -> None:
        with self._swap:  # an upgrade finishing after this drops its session
            self._closed = True
            self._sess = self._wide = None  # the sessions' arenas are freed when the last reference goes
            self._kept = self._deferred = None
