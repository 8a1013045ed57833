"""Small real models built from code (no downloads): used by `make demo`, the tests and the benchmarks."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ground.manifest import DynamicBatching, ModelFormat, ModelManifest, TensorSpec


def build_onnx_mlp(path: Path, dims: tuple[int, ...] = (64, 128, 10), seed: int = 0) -> None:
    """A float32 MLP with a dynamic batch dimension: input 'input' [-1, dims[0]], output 'output' [-1, dims[-1]]."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    prev = "input"
    for i in range(len(dims) - 1):
        w = (rng.standard_normal((dims[i], dims[i + 1])) / np.sqrt(dims[i])).astype(np.float32)
        b = (rng.standard_normal(dims[i + 1]) * 0.01).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"mm{i}"]))
        last = i == len(dims) - 2
        out = "output" if last else f"h{i}"
        nodes.append(helper.make_node("Add", [f"mm{i}", f"b{i}"], [out if last else f"a{i}"]))
        if not last:
            nodes.append(helper.make_node("Relu", [f"a{i}"], [out]))
        prev = out
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", dims[0]])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", dims[-1]])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def build_onnx_typed(path: Path) -> None:
    """One input and output per v2 datatype: FP32 x2, INT64 +1, INT32 identity, BOOL not, FP16 identity,
    BYTES identity. All have a dynamic batch dimension."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    T = TensorProto
    specs = [("f32", T.FLOAT), ("i64", T.INT64), ("i32", T.INT32), ("b", T.BOOL), ("f16", T.FLOAT16)]
    ins = [helper.make_tensor_value_info(f"in_{n}", t, ["batch", 4]) for n, t in specs]
    ins.append(helper.make_tensor_value_info("in_s", T.STRING, ["batch", 1]))
    outs = [helper.make_tensor_value_info(f"out_{n}", t, ["batch", 4]) for n, t in specs]
    outs.append(helper.make_tensor_value_info("out_s", T.STRING, ["batch", 1]))
    inits = [numpy_helper.from_array(np.array(2.0, np.float32), "two"), numpy_helper.from_array(np.array(1, np.int64), "one")]
    nodes = [
        helper.make_node("Mul", ["in_f32", "two"], ["out_f32"]),
        helper.make_node("Add", ["in_i64", "one"], ["out_i64"]),
        helper.make_node("Identity", ["in_i32"], ["out_i32"]),
        helper.make_node("Not", ["in_b"], ["out_b"]),
        helper.make_node("Identity", ["in_f16"], ["out_f16"]),
        helper.make_node("Identity", ["in_s"], ["out_s"]),
    ]
    graph = helper.make_graph(nodes, "typed", ins, outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def _torch_module(in_dim: int = 16, out_dim: int = 4, seed: int = 0, hidden: int = 32):
    import torch

    torch.manual_seed(seed)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(in_dim, hidden)
            self.out = torch.nn.Linear(hidden, out_dim)

        def forward(self, x):
            return torch.tanh(self.out(torch.relu(self.fc(x))))

    return Net().eval()


def build_torchscript(path: Path, in_dim: int = 16, out_dim: int = 4, seed: int = 0, hidden: int = 32) -> None:
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.jit.save(torch.jit.script(_torch_module(in_dim, out_dim, seed, hidden)), str(path))


def build_torch_export(path: Path, in_dim: int = 16, out_dim: int = 4, seed: int = 0) -> None:
    import torch
    from torch.export import Dim

    mod = _torch_module(in_dim, out_dim, seed)
    ep = torch.export.export(mod, (torch.zeros(2, in_dim),), dynamic_shapes={"x": {0: Dim("batch", min=1, max=4096)}})
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.export.save(ep, str(path))


def torch_reference(x: np.ndarray, in_dim: int = 16, out_dim: int = 4, seed: int = 0) -> np.ndarray:
    import torch

    with torch.inference_mode():
        return _torch_module(in_dim, out_dim, seed)(torch.from_numpy(x)).numpy()


def torch_manifest(
    tenant: str, model: str, version: str, fmt: ModelFormat, filename: str, in_dim: int = 16, out_dim: int = 4
) -> ModelManifest:
    in_name, out_name = ("x", "output__0") if fmt is ModelFormat.TORCH_EXPORT else ("INPUT__0", "OUTPUT__0")
    return ModelManifest(
        tenant=tenant,
        model=model,
        version=version,
        format=fmt,
        model_file=filename,
        inputs=[TensorSpec(name=in_name, datatype="FP32", shape=[-1, in_dim])],
        outputs=[TensorSpec(name=out_name, datatype="FP32", shape=[-1, out_dim])],
        max_batch_size=32,
        dynamic_batching=DynamicBatching(),
    )


def onnx_manifest(tenant: str, model: str, version: str, path: Path, filename: str) -> ModelManifest:
    """A manifest whose signature is read from the ONNX file itself."""
    from hostd.runtimes.registry import read_signature

    sig = read_signature(path, ModelFormat.ONNX)
    assert sig is not None
    ins, outs = sig
    return ModelManifest(
        tenant=tenant, model=model, version=version, format=ModelFormat.ONNX, model_file=filename,
        inputs=ins, outputs=outs,
    )


def seed_store(root: Path, tenant: str = "demo", mlp_dims: tuple[int, ...] = (64, 128, 10)) -> list[ModelManifest]:
    """Build the demo models into a local store (missing ones only). Returns the manifests in the store."""
    import tempfile

    from storage_adapters.local import LocalStorage
    from catalog.publish import publish_version
    from catalog.repository import ModelRepository

    repo = ModelRepository(LocalStorage(root))
    have = set(repo.models(tenant)) if (root / "tenants").exists() else set()
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        if "mlp" not in have:
            build_onnx_mlp(t / "mlp.onnx", mlp_dims)
            publish_version(repo, onnx_manifest(tenant, "mlp", "1", t / "mlp.onnx", "model.onnx"), {"model.onnx": t / "mlp.onnx"})
        if "typed" not in have:
            build_onnx_typed(t / "typed.onnx")
            publish_version(repo, onnx_manifest(tenant, "typed", "1", t / "typed.onnx", "model.onnx"), {"model.onnx": t / "typed.onnx"})
        if "scripted" not in have:
            build_torchscript(t / "scripted.pt")
            publish_version(
                repo, torch_manifest(tenant, "scripted", "1", ModelFormat.TORCHSCRIPT, "model.pt"), {"model.pt": t / "scripted.pt"}
            )
        if "exported" not in have:
            build_torch_export(t / "exported.pt2")
            publish_version(
                repo, torch_manifest(tenant, "exported", "1", ModelFormat.TORCH_EXPORT, "model.pt2"), {"model.pt2": t / "exported.pt2"}
            )
    return repo.all_manifests()
