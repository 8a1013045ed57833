"""The runtime interface: load a verified model file into a session that runs numpy batches.

torch is imported only when a torch model is loaded, so a hostd serving only ONNX stays small.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ground.manifest import ModelFormat, ModelManifest, TensorSpec


class RuntimeLoadError(Exception):
    """The file could not be deserialized into a runnable model (corrupt, wrong format, unsafe)."""


@dataclass(frozen=True)
class DeviceSpec:
    kind: str = "cpu"  # "cpu" or "cuda"
    index: int = 0
    ort_intra_op_threads: int = 0
    ort_spinning: bool = False
    torch_threads: int = 0

    @property
    def name(self) -> str:
        return "cpu" if self.kind == "cpu" else f"cuda:{self.index}"


class LoadedModel(abc.ABC):
    """A deserialized model. `run` may be called from several executor threads at once."""

    device: DeviceSpec

    @abc.abstractmethod
    def run(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]: ...

    @abc.abstractmethod
    def close(self) -> None:
        """Release every reference to runtime memory (sessions, modules, device buffers)."""


_primed: set[tuple[str, str]] = set()


def prepare_runtime(fmt: ModelFormat, device: DeviceSpec) -> None:
    """Import the runtime and run one trivial model on the device ahead of the first load, so that the
    memory measured around a load is the model's own, not the library's one-time cost (importing torch
    alone takes ~200 MB; ONNX Runtime's first session allocates its thread pools and arenas)."""
    kind = "onnx" if fmt is ModelFormat.ONNX else "torch"
    if (kind, device.name) in _primed:
        return
    if kind == "onnx":
        from onnx import TensorProto, helper

        from hostd.runtimes.onnx import _session

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
    else:
        import torch

        with torch.inference_mode():
            (torch.ones(4, 4, device=device.name) @ torch.ones(4, 4, device=device.name)).sum().item()
    _primed.add((kind, device.name))


def load_model(source: Path | bytes, manifest: ModelManifest, device: DeviceSpec) -> LoadedModel:
    """`source` is the model file, or its bytes (the host-RAM tier: no disk read on a reload)."""
    if manifest.format is ModelFormat.ONNX:
        from hostd.runtimes.onnx import OnnxModel

        return OnnxModel(source, manifest, device)
    from hostd.runtimes.torch_rt import TorchModel

    return TorchModel(source, manifest, device)


def read_signature(path: Path, fmt: ModelFormat) -> tuple[list[TensorSpec], list[TensorSpec]] | None:
    """Inputs and outputs as the file declares them; None where the format does not carry them
    (TorchScript), in which case the uploader must state them."""
    if fmt is ModelFormat.ONNX:
        from hostd.runtimes.onnx import onnx_signature

        return onnx_signature(path)
    if fmt is ModelFormat.TORCH_EXPORT:
        from hostd.runtimes.torch_rt import export_signature

        return export_signature(path)
    return None


def detect_format(path: Path) -> ModelFormat:
    """By content, never by trusting the extension alone."""
    with open(path, "rb") as f:
        head = f.read(4)
    if head[:2] == b"PK":  # zip archive: TorchScript or torch.export
        import zipfile

        try:
            with zipfile.ZipFile(path) as z:
                names = z.namelist()
        except zipfile.BadZipFile as e:
            raise RuntimeLoadError(f"{path.name}: not a valid zip archive: {e}") from e
        if any(n.endswith("serialized_exported_program.json") or "/models/" in n and n.endswith(".json") for n in names):
            return ModelFormat.TORCH_EXPORT
        if any(n.endswith("constants.pkl") or n.endswith("/code/__torch__.py") or "/code/" in n for n in names):
            return ModelFormat.TORCHSCRIPT
        if any(n.endswith("data.pkl") for n in names):
            raise RuntimeLoadError(
                f"{path.name}: a pickled torch object (torch.save); refused because unpickling can run "
                "arbitrary code. Export the model with torch.jit.script/trace or torch.export instead."
            )
        raise RuntimeLoadError(f"{path.name}: unrecognised zip archive")
    if head[:2] == b"\x80\x02" or head[:1] == b"\x80":
        raise RuntimeLoadError(f"{path.name}: a Python pickle; refused because unpickling can run arbitrary code")
    return ModelFormat.ONNX
