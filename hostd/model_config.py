"""Triton's ModelConfig for a model, from its manifest (what ModelConfig answers; tritonclient's
get_model_config reads it). Pure conversion: no manager, no gRPC."""

from __future__ import annotations

from ground.manifest import ModelManifest
from protos import model_config_pb2 as mc


def model_config(m: ModelManifest) -> mc.ModelConfig:
    batched = bool(m.max_batch_size)

    def dims(shape: list[int]) -> list[int]:
        return shape[1:] if batched else shape

    def dtype(d: str) -> str:  # the DataType's name; protobuf takes enum names as well as numbers
        return "TYPE_STRING" if d == "BYTES" else f"TYPE_{d}"

    cfg = mc.ModelConfig(
        name=m.model,
        platform=m.format.platform,
        backend="onnxruntime" if m.format.value == "onnx" else "pytorch",
        max_batch_size=m.max_batch_size or 0,
        input=[mc.ModelInput(name=t.name, data_type=dtype(t.datatype), dims=dims(t.shape)) for t in m.inputs],
        output=[mc.ModelOutput(name=t.name, data_type=dtype(t.datatype), dims=dims(t.shape)) for t in m.outputs],
        instance_group=[mc.ModelInstanceGroup(name=f"{m.model}_0", count=m.instance_count, kind=mc.ModelInstanceGroup.KIND_AUTO)],
        default_model_filename=m.model_file,
    )
    if batched:
        b = m.batching
        q = m.queue_policy
        cfg.dynamic_batching.CopyFrom(
            mc.ModelDynamicBatching(
                preferred_batch_size=b.preferred_batch_sizes,
                max_queue_delay_microseconds=b.max_queue_delay_us,
                priority_levels=b.priority_levels,
                default_priority_level=b.default_priority_level,
                default_queue_policy=mc.ModelQueuePolicy(
                    timeout_action=mc.ModelQueuePolicy.DELAY if q.timeout_action == "delay" else mc.ModelQueuePolicy.REJECT,
                    default_timeout_microseconds=q.default_timeout_us,
                    allow_timeout_override=q.allow_timeout_override,
                    max_queue_size=q.max_queue_size,
                ),
            )
        )
    return cfg
