"""Model runtimes: ONNX Runtime, TorchScript and torch.export, behind one small interface.

base.py is the interface (LoadedModel, DeviceSpec, RuntimeLoadError); onnx.py and torch_rt.py implement it;
registry.py maps each model format to its runtime (load_model, prepare_runtime, read_signature,
detect_format).
"""
