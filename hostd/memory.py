"""Memory probes: how much device memory is in use, measured, never guessed.

NVML (the `pynvml` module of nvidia-ml-py) on a GPU; on a machine without one `nvmlInit` raises
NVMLError_LibraryNotFound (or the module is absent), and the CPU fallback — this process's resident set
size — is selected with one log line.
"""

from __future__ import annotations

import abc
import logging
import os

import psutil

log = logging.getLogger(__name__)


class MemoryProbe(abc.ABC):
    name: str

    @abc.abstractmethod
    def used(self) -> int:
        """Bytes in use now (device memory on a GPU; this process's RSS on CPU)."""

    @abc.abstractmethod
    def total(self) -> int:
        """Bytes the device has."""

    def utilization(self) -> float | None:
        return None


class CpuProbe(MemoryProbe):
    name = "cpu"

    def __init__(self) -> None:
        self._proc = psutil.Process(os.getpid())

    def used(self) -> int:
        return self._proc.memory_info().rss

    def total(self) -> int:
        return psutil.virtual_memory().total


class NvmlProbe(MemoryProbe):
    def __init__(self, index: int = 0) -> None:
        import pynvml

        self._nvml = pynvml
        pynvml.nvmlInit()
        self._h = pynvml.nvmlDeviceGetHandleByIndex(index)
        self.name = f"cuda:{index}"
        uuid = pynvml.nvmlDeviceGetUUID(self._h)  # the nv_gpu_* label (hostd/triton_metrics.py)
        self.uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)

    def used(self) -> int:
        return int(self._nvml.nvmlDeviceGetMemoryInfo(self._h).used)

    def total(self) -> int:
        return int(self._nvml.nvmlDeviceGetMemoryInfo(self._h).total)

    def utilization(self) -> float | None:
        return float(self._nvml.nvmlDeviceGetUtilizationRates(self._h).gpu) / 100.0


def select_probe(device_kind: str, index: int = 0) -> MemoryProbe:
    """NVML when the device is CUDA and NVML answers; otherwise the CPU fallback."""
    if device_kind == "cuda":
        try:
            return NvmlProbe(index)
        except ImportError:
            log.warning("nvidia-ml-py is not installed: using the CPU memory probe")
        except Exception as e:  # pynvml.NVMLError_LibraryNotFound and friends
            log.warning("NVML unavailable (%s): using the CPU memory probe", type(e).__name__)
    return CpuProbe()


def cuda_available() -> bool:
    """True when a CUDA device can be used: NVML sees a GPU and onnxruntime has the CUDA provider."""
    try:
        import pynvml

        pynvml.nvmlInit()
        n = pynvml.nvmlDeviceGetCount()
    except Exception:  # no library, no driver, no GPU
        return False
    if n < 1:
        return False
    try:
        import onnxruntime as ort

        return "CUDAExecutionProvider" in ort.get_available_providers()
    except ImportError:
        return False


def release_free_memory() -> None:
    """Hand freed heap memory back to the OS (glibc malloc_trim), so that the process's resident size
    reflects live memory: unloading a model on CPU really frees it, and a load measured by RSS is not
    hidden by memory the allocator reused. A no-op where glibc is absent."""
    global _libc
    if _libc is None:
        try:
            import ctypes

            _libc = ctypes.CDLL("libc.so.6")
        except OSError:
            _libc = False
    if _libc:
        _libc.malloc_trim(0)


_libc = None
