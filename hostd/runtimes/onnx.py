"""ONNX Runtime: the CUDA execution provider when a GPU is present and selected, else CPU."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from hostd.runtimes.base import DeviceSpec, LoadedModel, RuntimeLoadError
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


def _session(source: Path | bytes, device: DeviceSpec):
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
    try:
        return ort.InferenceSession(source if isinstance(source, bytes) else str(source), so, providers=_providers(device))
    except RuntimeLoadError:
        raise
    except Exception as e:  # ORT raises its own exception types for corrupt graphs
        raise RuntimeLoadError(f"onnxruntime could not load the model: {e}") from e


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
    sess = _session(m.SerializeToString(), device)
    sess.run(None, {"x": np.zeros((1, 4), np.float32)})
    del sess


def _dims(shape) -> list[int]:
    return [d if isinstance(d, int) and d >= 0 else -1 for d in shape]


def onnx_signature(path: Path) -> tuple[list[TensorSpec], list[TensorSpec]]:
    sess = _session(path, DeviceSpec())

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
    def __init__(self, source: Path | bytes, manifest: ModelManifest, device: DeviceSpec) -> None:
        self.device = device
        self._sess = _session(source, device)
        self._output_names = [o.name for o in self._sess.get_outputs()]

    def run(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        names = outputs or self._output_names
        feed = {k: (_to_str(v) if v.dtype == object else v) for k, v in inputs.items()}
        res = self._sess.run(names, feed)
        return {n: (_to_bytes(r) if r.dtype == object or r.dtype.kind == "U" else r) for n, r in zip(names, res, strict=True)}

    def close(self) -> None:
        self._sess = None  # the session's arenas are freed when the last reference goes
