"""ground/manifest.py: a manifest without a dynamic_batching section answers `batching` with one shared,
frozen default (read on every request's path: hostd/dataplane.py's request_priority), never a new object."""

from __future__ import annotations

import pydantic
import pytest

from ground.manifest import DynamicBatching, ModelFormat, ModelManifest, TensorSpec
from hostd.dataplane import request_priority


def _manifest(**kw) -> ModelManifest:
    t = [TensorSpec(name="x", datatype="FP32", shape=[-1, 4])]
    return ModelManifest(tenant="acme", model="m", version="1", format=ModelFormat.ONNX, model_file="m.onnx",
                         inputs=t, outputs=t, **kw)


def test_manifests_without_the_section_share_one_default():
    a, b = _manifest(), _manifest()
    assert a.batching is b.batching and a.batching == DynamicBatching()
    with pytest.raises(pydantic.ValidationError):
        a.batching.max_queue_delay_us = 5  # frozen: the shared default cannot be changed through one model
    assert b.batching.max_queue_delay_us == 0


def test_a_section_of_its_own_is_the_manifests_own():
    own = DynamicBatching(priority_levels=3, default_priority_level=2)
    m = _manifest(dynamic_batching=own)
    assert m.batching is m.dynamic_batching and m.batching.priority_levels == 3
    assert request_priority(0, m) == 2 and request_priority(0, _manifest()) == 1
    assert m.model_copy(update={"max_batch_size": 0}).batching == own
    assert ModelManifest.model_validate_json(m.model_dump_json()) == m
