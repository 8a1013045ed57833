"""TorchScript (torch.jit) and torch.export (.pt2) models. Never unpickles arbitrary objects:
TorchScript archives load through torch.jit's restricted loader, and .pt2 through torch.export.load;
plain torch.save pickles are refused before they reach here (see registry.detect_format)."""

from __future__ import annotations

import io
import queue
import threading
from contextlib import nullcontext
from pathlib import Path

import numpy as np

from hostd.runtimes.base import DeviceSpec, LoadedModel, ModelSource, RuntimeLoadError, GraphSource
from ground.manifest import ModelFormat, ModelManifest, TensorSpec

_threads_set = threading.Lock()


def _torch(device: DeviceSpec):
    """torch, with its intra-op threads set to the host's plan (hostd/core/sizing.py: slots x threads <= cores;
    the setting is process-wide, and each running batch's thread gets a team of that size)."""
    import torch

    with _threads_set:
        if device.torch_threads and torch.get_num_threads() != device.torch_threads:
            torch.set_num_threads(device.torch_threads)
    return torch


def prime(device: DeviceSpec) -> None:
    """Import torch and run one matmul on the device: importing torch alone takes ~200 MB, a one-time
    cost that must not be counted as the first model's memory."""
    import torch

    with torch.inference_mode():
        (torch.ones(4, 4, device=device.name) @ torch.ones(4, 4, device=device.name)).sum().item()


_TORCH_TO_V2 = {
    "torch.float32": "FP32",
    "torch.float16": "FP16",
    "torch.float64": "FP64",
    "torch.int64": "INT64",
    "torch.int32": "INT32",
    "torch.int16": "INT16",
    "torch.int8": "INT8",
    "torch.uint8": "UINT8",
    "torch.bool": "BOOL",
}


def _file(source: ModelSource) -> io.BytesIO | str:
    if isinstance(source, GraphSource):  # the graph cache is ONNX Runtime's; the loader never sends one here
        raise RuntimeLoadError("torch models have no saved graphs")
    return io.BytesIO(source) if isinstance(source, (bytes, bytearray, memoryview)) else str(source)


def _load_export(source: ModelSource):
    import torch

    try:
        return torch.export.load(_file(source))
    except Exception as e:
        raise RuntimeLoadError(f"torch.export could not load the model: {e}") from e


def export_signature(path: Path) -> tuple[list[TensorSpec], list[TensorSpec]]:
    ep = _load_export(path)
    user_inputs = set(ep.graph_signature.user_inputs)
    ins: list[TensorSpec] = []
    outs: list[TensorSpec] = []
    for node in ep.graph.nodes:
        if node.op == "placeholder" and node.name in user_inputs:
            ins.append(_spec(node.name, node.meta.get("val")))
        if node.op == "output":
            vals = node.args[0] if isinstance(node.args[0], (tuple, list)) else [node.args[0]]
            for i, v in enumerate(vals):
                outs.append(_spec(f"output__{i}", v.meta.get("val") if hasattr(v, "meta") else None))
    return ins, outs


def _spec(name: str, val) -> TensorSpec:
    if val is None or not hasattr(val, "shape"):
        raise RuntimeLoadError(f"cannot read the shape and dtype of {name!r} from the exported program")
    dtype = _TORCH_TO_V2.get(str(val.dtype))
    if dtype is None:
        raise RuntimeLoadError(f"tensor {name!r} has unsupported dtype {val.dtype}")
    shape = [int(d) if isinstance(d, int) or str(d).isdigit() else -1 for d in val.shape]
    return TensorSpec(name=name, datatype=dtype, shape=shape)


class TorchModel(LoadedModel):
    def __init__(self, source: ModelSource, manifest: ModelManifest, device: DeviceSpec) -> None:
        torch = _torch(device)
        self.device = device
        self._torch = torch
        self._dev = torch.device(device.name)
        self._input_names = [t.name for t in manifest.inputs]
        self._output_names = [t.name for t in manifest.outputs]
        if manifest.format is ModelFormat.TORCHSCRIPT:
            try:
                mod = torch.jit.load(_file(source), map_location=self._dev)
            except Exception as e:
                raise RuntimeLoadError(f"torch.jit could not load the model: {e}") from e
            mod.eval()
            self._fn = mod
        else:
            ep = _load_export(source)
            self._fn = ep.module().to(self._dev)
        # On a GPU, one CUDA stream per instance: each concurrent run (at most the model's instances) takes a
        # stream of its own from this pool, so instances' kernels overlap instead of queueing on one stream.
        self._streams: queue.SimpleQueue = queue.SimpleQueue()
        self.streams_made = 0

    def _stream(self):
        try:
            return self._streams.get_nowait()
        except queue.Empty:
            self.streams_made += 1
            return self._torch.cuda.Stream(device=self._dev)

    def run(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        torch = self._torch
        stream = self._stream() if self.device.kind == "cuda" else None
        try:
            with torch.cuda.stream(stream) if stream is not None else nullcontext():
                args = [torch.from_numpy(np.require(inputs[n], requirements=["C", "W"])).to(self._dev)
                        for n in self._input_names]
                with torch.inference_mode():
                    res = self._fn(*args)
                if isinstance(res, torch.Tensor):
                    res = (res,)
                if isinstance(res, dict):
                    res = tuple(res[n] for n in self._output_names)
                if len(res) != len(self._output_names):
                    raise RuntimeError(f"model returned {len(res)} outputs, the manifest declares {len(self._output_names)}")
                # .to("cpu") waits for this stream's work: the batch is done when run returns
                out = {n: r.detach().to("cpu").numpy() for n, r in zip(self._output_names, res, strict=True)}
        finally:
            if stream is not None:
                self._streams.put(stream)
        return {n: out[n] for n in (outputs or self._output_names)}

    def close(self) -> None:
        self._fn = None
        if self.device.kind == "cuda":
            self._torch.cuda.empty_cache()
