"""Triton Inference Server's core as the yardstick for hostd's batching (bench/batching.py): nvidia-pytriton
starts the tritonserver binary it bundles, with Triton's dynamic batcher in front of a Python inference function
that runs the ONNX model with onnxruntime (Triton's Python backend hands each batch to this process).

Runs in its own virtual environment (bench/pytriton_env.py): nvidia-pytriton pins numpy 1.x and protobuf 6,
which the project's environment must not be downgraded to. So this file imports nothing from the project.

    python bench/pytriton_server.py MODEL.onnx GRPC_PORT HTTP_PORT METRICS_PORT MAX_BATCH QUEUE_DELAY_US"""

from __future__ import annotations

import sys


def main() -> None:
    import numpy as np
    import onnxruntime as ort
    from pytriton.decorators import batch
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    path, grpc_port, http_port, metrics_port, max_batch, delay_us = sys.argv[1:7]
    so = ort.SessionOptions()
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    # as hostd's sessions (hostd/runtimes/onnx.py): no spinning threads taking the shared cores between runs
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    inp, out = sess.get_inputs()[0], sess.get_outputs()[0]

    @batch
    def infer(**inputs):
        return {out.name: sess.run([out.name], {inp.name: inputs[inp.name]})[0]}

    config = TritonConfig(grpc_port=int(grpc_port), http_port=int(http_port), metrics_port=int(metrics_port),
                          log_verbose=0)
    with Triton(config=config) as triton:
        triton.bind(
            model_name="mlp",
            infer_func=infer,
            inputs=[Tensor(name=inp.name, dtype=np.float32, shape=(inp.shape[1],))],
            outputs=[Tensor(name=out.name, dtype=np.float32, shape=(out.shape[1],))],
            config=ModelConfig(max_batch_size=int(max_batch),
                               batcher=DynamicBatcher(max_queue_delay_microseconds=int(delay_us))),
            strict=False,
        )
        triton.serve()


if __name__ == "__main__":
    main()
