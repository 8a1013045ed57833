"""Raw response encoding: the old way (per-output add/append, `np.ascontiguousarray(...).tobytes()`) vs
hostd/tensors.py's `encode_response`, for a 1 MiB FP32 output, C-contiguous and strided, and what
serialising the message costs on top (gRPC does that, outside hostd). Prints the best of several runs,
and a plain 1 MiB memcpy for scale. CPU only; a second or two.

    python -m bench.encode

What it showed (2 shared cores): the strided output is ~15% faster (one copy fewer); the C-contiguous one
has the same two copies as before. With glibc's default malloc thresholds a C-contiguous 1 MiB encode takes
~1 ms, almost all page faults on freshly mapped buffers; with
MALLOC_MMAP_THRESHOLD_=67108864 MALLOC_TRIM_THRESHOLD_=268435456 it takes ~70 us (two memcpys' worth).
"""

from __future__ import annotations

import time

import numpy as np

from ground.manifest import ModelFormat, ModelManifest, TensorSpec
from hostd.tensors import encode_bytes_raw, encode_response, v2_datatype
from protos import grpc_service_pb2 as pb

M = ModelManifest(
    tenant="t", model="m", version="1", format=ModelFormat.ONNX, model_file="model.onnx", max_batch_size=0,
    inputs=[TensorSpec(name="x", datatype="FP32", shape=[-1, -1])],
    outputs=[TensorSpec(name="y", datatype="FP32", shape=[-1, -1])],
)


def encode_old(req, m, outputs, names, raw):
    """encode_response before: add and append per output, a contiguous copy before tobytes."""
    resp = pb.ModelInferResponse(model_name=req.model_name, model_version=m.version, id=req.id)
    for name in names:
        arr = outputs[name]
        dt = v2_datatype(arr)
        resp.outputs.add(name=name, datatype=dt, shape=arr.shape)
        resp.raw_output_contents.append(encode_bytes_raw(arr) if dt == "BYTES" else np.ascontiguousarray(arr).tobytes())
    return resp


def best_us(*fns, repeat: int = 60, number: int = 3) -> list[float]:
    """Best time per call of each function, in microseconds; the functions take turns, so a busy machine
    slows them alike."""
    for fn in fns:
        fn()
    best = [float("inf")] * len(fns)
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            t = time.perf_counter()
            for _ in range(number):
                fn()
            best[i] = min(best[i], (time.perf_counter() - t) / number)
    return [b * 1e6 for b in best]


def main() -> None:
    req = pb.ModelInferRequest(model_name="m", id="r")
    dense = np.random.default_rng(0).random((512, 512), dtype=np.float32)  # 1 MiB
    wide = np.random.default_rng(1).random((512, 1024), dtype=np.float32)
    cases = {"1 MiB C-contiguous": dense, "1 MiB strided (every 2nd column)": wide[:, ::2]}
    buf = dense.tobytes()
    print(f"{'memcpy 1 MiB':40s} {best_us(lambda: bytearray(buf))[0]:8.0f} us")
    for label, arr in cases.items():
        outs = {"y": arr}
        old, new = best_us(lambda o=outs: encode_old(req, M, o, ["y"], True),
                           lambda o=outs: encode_response(req, M, o, ["y"], True))
        assert encode_old(req, M, outs, ["y"], True) == encode_response(req, M, outs, ["y"], True)
        msg = encode_response(req, M, outs, ["y"], True)
        (ser,) = best_us(msg.SerializeToString)
        print(f"{label:40s} old {old:8.0f} us   new {new:8.0f} us   ({old / new:4.2f}x)   serialise {ser:6.0f} us")


if __name__ == "__main__":
    main()
