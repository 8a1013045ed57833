"""The runtime interface: a verified model file loaded into a session that runs numpy batches.

Only the interface lives here; hostd/runtimes/registry.py maps each model format to its runtime.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ground.manifest import DATATYPES, TensorSpec


class RuntimeLoadError(Exception):
    """The file could not be deserialized into a runnable model (corrupt, wrong format, unsafe)."""


@dataclass(frozen=True)
class DeviceSpec:
    kind: str = "cpu"  # "cpu" or "cuda"
    index: int = 0
    ort_intra_op_threads: int = 0
    ort_spinning: bool = False
    ort_wide_threads: int = 0  # intra-op threads of a model's second session for lone batches (0: none)
    ort_wide_prepacked: bool = False  # that session prepacks its weights (a second packed copy; hostd/runtimes/onnx.py)
    torch_threads: int = 0

    @property
    def name(self) -> str:
        return "cpu" if self.kind == "cpu" else f"cuda:{self.index}"


@dataclass(frozen=True)
class GraphSource:
    """A model's graph with its weights apart. `optimized`: the runtime saved it optimized for this device
    (the disk tier's graph cache), and it loads without optimizing again; else it was split from the model
    file's bytes (weights read in place) and is optimized at load like the file. On disk, `graph` is its
    path (the weights file beside it); in memory, its bytes, with `weights` the weights' buffer, which the
    session reads in place where it can (`in_place`: then it lives as long as the session; set it only for
    a buffer a cache tier owns anyway) or copies from."""

    graph: Path | bytes
    weights: bytes | bytearray | memoryview | None = None
    optimized: bool = True
    in_place: bool = True


# What a runtime loads: the model file, its verified bytes (the RAM tier's), or a graph with its weights apart.
ModelSource = Path | bytes | bytearray | memoryview | GraphSource


class LoadedModel(abc.ABC):
    """A deserialized model. `run` may be called from several executor threads at once."""

    device: DeviceSpec
    # bytes of the source the model goes on reading from after the load (weights used in place); the loader
    # counts them as the model's own unless a cache tier already does
    kept_bytes: int = 0
    wide: bool = False  # run_wide uses every core (a second session); else it is run

    @abc.abstractmethod
    def run(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]: ...

    def run_wide(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        """A lone batch while nothing else runs on the host (hostd/core/dispatch.py): on every core."""
        return self.run(inputs, outputs)

    @property
    def upgrade_pending(self) -> bool:
        """The load deferred work that `upgrade` does (ONNX on CPU: prepacking the weights)."""
        return False

    def upgrade(self) -> None:  # noqa: B027 - a default: most runtimes defer nothing
        """Do what the load deferred, off the request path (on a load worker, hostd/loader.py), while the
        model answers; safe to call after close (then it does nothing)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release every reference to runtime memory (sessions, modules, device buffers)."""


def warmup_inputs(inputs: Iterable[TensorSpec]) -> dict[str, np.ndarray]:
    """Zeros of every input, batch 1, dynamic dimensions 1: the loader's warm-up and the upload check's test
    inference (hostd/validate.py)."""
    out = {}
    for t in inputs:
        shape = [1 if d == -1 else d for d in t.shape]
        if t.datatype == "BYTES":
            out[t.name] = np.full(shape, b"", dtype=object)
        else:
            out[t.name] = np.zeros(shape, dtype=DATATYPES[t.datatype])
    return out
