"""Which ModelInfer answers carry `mmhost-served` (what a router's access log reads): a call from a router's
Python lane (it carries mmhost-tenant) does; a fast-lane call (mmhost-lane: fast, HAProxy passes trailers on
to the tenant) and a direct dev-mode call (no mmhost-tenant: Triton's tools, which never read it) do not."""

from __future__ import annotations

import numpy as np
import pytest

from ground.wire import LANE_HEADER, SERVED, TENANT_HEADER
from protos import grpc_service_pb2 as pb


def _req() -> pb.ModelInferRequest:
    x = np.ones((1, 64), dtype=np.float32)
    return pb.ModelInferRequest(model_name="mlp", raw_input_contents=[x.tobytes()], inputs=[
        pb.ModelInferRequest.InferInputTensor(name="input", datatype="FP32", shape=[1, 64])])


@pytest.mark.parametrize(("metadata", "carries"), [
    (((TENANT_HEADER, "demo"),), True),
    (((TENANT_HEADER, "demo"), (LANE_HEADER, "fast")), False),
    ((), False),
])
def test_only_a_routers_python_lane_gets_mmhost_served(hostd, metadata, carries):
    _, call = hostd.stub.ModelInfer.with_call(_req(), metadata=metadata, timeout=30)
    trailers = dict(call.trailing_metadata() or ())
    assert (SERVED in trailers) is carries
    if carries:
        assert trailers[SERVED].startswith("v=1;")
