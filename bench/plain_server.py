"""The plain per-request server: the floor hostd is held to at concurrency 1 (bench/batching.py). A minimal
grpc.aio KServe v2 server with one onnxruntime session and nothing else: each ModelInfer's raw input runs through
the session by itself, on the event loop (one request at a time, no batching, no thread hop, no queue, no
metrics, no tenancy), and its output goes back as raw bytes.

    python -m bench.plain_server LISTEN MODEL.onnx MODEL_NAME"""

from __future__ import annotations

import asyncio
import sys

import numpy as np
from grpc import aio

from protos import grpc_service_pb2 as pb
from protos import grpc_service_pb2_grpc as pb_grpc


def session(path: str):
    """As hostd's sessions (hostd/runtimes/onnx.py) on this host: ORT's default intra-op threads, no spinning."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


class PlainServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, path: str, name: str) -> None:
        self.sess = session(path)
        self.name = name
        self.input = self.sess.get_inputs()[0].name
        self.outputs = [o.name for o in self.sess.get_outputs()]

    async def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=True)

    async def ModelReady(self, request, context):
        return pb.ModelReadyResponse(ready=request.name == self.name)

    async def ModelInfer(self, request, context):
        t = request.inputs[0]
        x = np.frombuffer(request.raw_input_contents[0], dtype=np.float32).reshape(list(t.shape))
        outs = self.sess.run(self.outputs, {self.input: x})
        resp = pb.ModelInferResponse(model_name=self.name, model_version="1", id=request.id)
        for name, y in zip(self.outputs, outs, strict=True):
            resp.outputs.add(name=name, datatype="FP32", shape=list(y.shape))
            resp.raw_output_contents.append(y.tobytes())
        return resp


async def serve(listen: str, path: str, name: str) -> None:
    big = [("grpc.max_send_message_length", 256 << 20), ("grpc.max_receive_message_length", 256 << 20)]
    server = aio.server(options=big)
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(PlainServicer(path, name), server)
    server.add_insecure_port(listen)
    await server.start()
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1], sys.argv[2], sys.argv[3]))
