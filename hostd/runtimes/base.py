"""The runtime interface: a verified model file loaded into a session that runs numpy batches.

Only the interface lives here; hostd/runtimes/registry.py maps each model format to its runtime.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

import numpy as np


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
