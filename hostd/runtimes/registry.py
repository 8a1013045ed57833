"""The runtime of each model format, and the entry points that pick one: load, prime, read a signature,
detect a file's format.

onnxruntime and torch are imported only when a model of theirs is loaded or primed, so a hostd serving only
ONNX stays small.
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ground.manifest import ModelFormat, ModelManifest, TensorSpec
from hostd.runtimes import onnx, torch_rt
from hostd.runtimes.base import DeviceSpec, GraphSource, LoadedModel, ModelSource, RuntimeLoadError

Signature = tuple[list[TensorSpec], list[TensorSpec]]


# Verified bytes -> (what to load and keep in the RAM tier, the original file in pieces) or None
Splitter = Callable[[memoryview], "tuple[GraphSource, Callable[[], Iterator[memoryview]]] | None"]


@dataclass(frozen=True)
class GraphSaver:
    """A runtime that keeps a model's graph apart from its weights: saves it optimized for a device (the disk
    tier's graph cache), and splits a model file's bytes so the weights are read in place."""

    key: Callable[[DeviceSpec], str]  # what a saved graph depends on beyond the model's bytes
    save: Callable[[ModelSource, DeviceSpec, Path], None]  # optimize, write into the folder given
    split: Splitter


@dataclass(frozen=True)
class Runtime:
    kind: str  # one library's one-time set-up covers every format of the same kind
    load: Callable[..., LoadedModel]  # (source, manifest, device[, defer_prepack=True when `defers`])
    prime: Callable[[DeviceSpec], None]
    signature: Callable[[Path], Signature] | None  # None: the file does not declare its inputs and outputs
    graphs: GraphSaver | None = None
    defers: bool = False  # load takes defer_prepack (LoadedModel.upgrade finishes it)


RUNTIMES: dict[ModelFormat, Runtime] = {
    ModelFormat.ONNX: Runtime("onnx", onnx.OnnxModel, onnx.prime, onnx.onnx_signature,
                              GraphSaver(onnx.graph_cache_key, onnx.save_graph, onnx.split_model), defers=True),
    ModelFormat.TORCHSCRIPT: Runtime("torch", torch_rt.TorchModel, torch_rt.prime, None),
    ModelFormat.TORCH_EXPORT: Runtime("torch", torch_rt.TorchModel, torch_rt.prime, torch_rt.export_signature),
}

_primed: set[tuple[str, str]] = set()


def prepare_runtime(fmt: ModelFormat, device: DeviceSpec) -> None:
    """Import the runtime and run one trivial model on the device ahead of the first load, so that the
    memory measured around a load is the model's own, not the library's one-time cost (importing torch
    alone takes ~200 MB; ONNX Runtime's first session allocates its thread pools and arenas)."""
    rt = RUNTIMES[fmt]
    if (rt.kind, device.name) in _primed:
        return
    rt.prime(device)
    _primed.add((rt.kind, device.name))


def load_model(source: ModelSource, manifest: ModelManifest, device: DeviceSpec, *,
               defer_prepack: bool = False) -> LoadedModel:
    """`source` is the model file, its bytes (read into memory from storage, or the host-RAM tier's), or a
    graph the runtime saved optimized (only for runtimes with `graphs`). `defer_prepack`: the runtime may
    answer before it has repacked the weights for its kernels, and finish in `upgrade` (model.upgrade_pending)."""
    rt = RUNTIMES[manifest.format]
    if defer_prepack and rt.defers:
        return rt.load(source, manifest, device, defer_prepack=True)
    return rt.load(source, manifest, device)


def graph_saver(fmt: ModelFormat) -> GraphSaver | None:
    return RUNTIMES[fmt].graphs


def read_signature(path: Path, fmt: ModelFormat) -> Signature | None:
    """Inputs and outputs as the file declares them; None where the format does not carry them
    (TorchScript), in which case the uploader must state them."""
    signature = RUNTIMES[fmt].signature
    return signature(path) if signature is not None else None


def detect_format(path: Path) -> ModelFormat:
    """By content, never by trusting the extension alone."""
    with open(path, "rb") as f:
        head = f.read(4)
    if head[:2] == b"PK":  # zip archive: TorchScript or torch.export
        try:
            with zipfile.ZipFile(path) as z:
                names = z.namelist()
        except zipfile.BadZipFile as e:
            raise RuntimeLoadError(f"{path.name}: not a valid zip archive: {e}") from e
        if any(n.endswith("serialized_exported_program.json") or "/models/" in n and n.endswith(".json")
               for n in names):
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
