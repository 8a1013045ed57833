"""Model runtimes: ONNX Runtime, TorchScript and torch.export, behind one small interface."""

from hostd.runtimes.base import DeviceSpec, LoadedModel, RuntimeLoadError, load_model, read_signature

__all__ = ["DeviceSpec", "LoadedModel", "RuntimeLoadError", "load_model", "read_signature"]
