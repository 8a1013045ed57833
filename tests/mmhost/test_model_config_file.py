"""Config files in every dialect: strict at every level (an unknown key anywhere names its full path), Triton's
names accepted as aliases, and config.pbtxt mapped onto the manifest's options or refused by name."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ground.manifest import ModelFormat
from mmhost.model_config_file import ConfigFileError, load_options
from mmhost.triton_config import IGNORED, REFUSED, TritonConfigError, parse_pbtxt
from mmhost.upload import UploadRefused, read_config
from tests.mmhost.conftest import MLP_CONFIG

MMHOST_YAML = """
max_batch_size: 16
dynamic_batching: {max_queue_delay_us: 2000, preferred_batch_sizes: [8, 16], priority_levels: 2}
queue_policy: {max_queue_size: 64, default_timeout_us: 500000, timeout_action: delay}
instance_count: 3
"""
TRITON_YAML = """
max_batch_size: 16
dynamic_batching:
  max_queue_delay_microseconds: 2000
  preferred_batch_size: [8, 16]
  priority_levels: 2
  default_queue_policy: {max_queue_size: 64, default_timeout_microseconds: 500000, timeout_action: DELAY}
instance_group: [{count: 2, kind: KIND_GPU}, {count: 1}]
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_triton_names_read_as_mmhost_names(tmp_path):
    want = read_config(_write(tmp_path, "a.yaml", MMHOST_YAML))
    assert read_config(_write(tmp_path, "b.yaml", TRITON_YAML)) == want
    assert read_config(_write(tmp_path, "c.json", json.dumps({
        "max_batch_size": 16, "instance_count": 3,
        "default_queue_policy": {"max_queue_size": 64, "default_timeout_us": 500000, "timeout_action": "delay"},
        "dynamic_batching": {"max_queue_delay_us": 2000, "preferred_batch_sizes": [8, 16], "priority_levels": 2},
    }))) == want
    assert want["queue_policy"]["timeout_action"] == "delay" and want["instance_count"] == 3


UNKNOWN = [
    # (dialect, text, the path the error must name)
    ("yaml", "warp_speed: 9\n", "warp_speed"),
    ("yaml", "queue_policy: {max_queue_sise: 4}\n", "queue_policy.max_queue_sise"),
    ("yaml", "dynamic_batching: {max_queue_delay_microseconds: 100, max_delay: 3}\n", "dynamic_batching.max_delay"),
    ("yaml", "dynamic_batching: {default_queue_policy: {max_queue_sise: 4}}\n",
     "dynamic_batching.default_queue_policy.max_queue_sise"),
    ("yaml", "instance_group: [{count: 1}, {cont: 2}]\n", "instance_group[1].cont"),
    ("json", '{"queue_policy": {"max_queue_sise": 4}}', "queue_policy.max_queue_sise"),
    ("json", '{"dynamic_batching": {"preferred_batch_size": [4], "max_queue_delay": 1}}', "dynamic_batching.max_queue_delay"),
    ("pbtxt", "max_batch_sise: 4\n", "max_batch_sise"),
    ("pbtxt", "max_batch_size: 4\ndynamic_batching { max_queue_delay_us: 100 }\n", "dynamic_batching.max_queue_delay_us"),
    ("pbtxt", "max_batch_size: 4\ndynamic_batching { default_queue_policy { max_queue_sise: 4 } }\n",
     "dynamic_batching.default_queue_policy.max_queue_sise"),
    ("pbtxt", 'input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] dimz: [ 2 ] } ]\n', "input.dimz"),
]


@pytest.mark.parametrize(("dialect", "text", "path"), UNKNOWN, ids=[f"{d}-{p}" for d, _, p in UNKNOWN])
def test_an_unknown_key_at_any_depth_is_an_error_naming_it(tmp_path, dialect, text, path):
    cfg = _write(tmp_path, f"cfg.{dialect}", text)
    with pytest.raises(UploadRefused) as ei:
        read_config(cfg)
    assert path in str(ei.value) and "unknown" in str(ei.value), str(ei.value)


def test_typos_get_a_suggestion_and_the_known_keys(tmp_path):
    with pytest.raises(ConfigFileError) as ei:
        load_options(_write(tmp_path, "c.yaml", "queue_policy: {max_queue_sise: 4}\n"))
    assert "did you mean max_queue_size?" in str(ei.value) and "default_timeout_us" in str(ei.value)
    with pytest.raises(ConfigFileError) as ei:
        load_options(_write(tmp_path, "c.pbtxt", "dynamic_batching { max_queue_delay_us: 1 }\n"))
    assert "did you mean max_queue_delay_microseconds?" in str(ei.value)


def test_bad_values_name_their_path(tmp_path):
    with pytest.raises(ConfigFileError) as ei:
        load_options(_write(tmp_path, "c.yaml", "queue_policy: {timeout_action: drop}\n"))
    assert "queue_policy.timeout_action" in str(ei.value)
    with pytest.raises(ConfigFileError) as ei:
        load_options(_write(tmp_path, "c.yaml", "- 1\n- 2\n"))
    assert "mapping" in str(ei.value)
    with pytest.raises(ConfigFileError) as ei:
        load_options(_write(tmp_path, "c.yaml", "max_queue_delay_us: 1\ndynamic_batching: {max_queue_delay_us: 1,"
                                                " max_queue_delay_microseconds: 2}\n"))
    assert "given twice" in str(ei.value) or "max_queue_delay_us" in str(ei.value)


def test_pbtxt_is_recognised_by_content(tmp_path):
    opts = load_options(_write(tmp_path, "mlp.config", MLP_CONFIG)).manifest_options()
    assert opts["max_batch_size"] == 16 and opts["format"] is ModelFormat.ONNX
    # YAML-parsable, but only a Triton config has these keys
    opts = load_options(_write(tmp_path, "flat", 'name: "m"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 4\n'))
    assert opts.manifest_options()["max_batch_size"] == 4
    # YAML stays YAML
    assert load_options(_write(tmp_path, "opts", MMHOST_YAML)).manifest_options()["instance_count"] == 3


def test_pbtxt_maps_onto_the_manifest_options():
    cfg = parse_pbtxt(MLP_CONFIG)
    opts = cfg.options.manifest_options()
    assert opts == {
        "max_batch_size": 16,
        "dynamic_batching": {"max_queue_delay_us": 100, "preferred_batch_sizes": [4, 8], "priority_levels": 2,
                             "default_priority_level": 2},
        "queue_policy": {"max_queue_size": 4, "default_timeout_us": 5000, "timeout_action": "delay",
                         "allow_timeout_override": True},
        "instance_count": 3,
        "format": ModelFormat.ONNX,
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 64]}],  # the batch dimension added
        "outputs": [{"name": "output", "datatype": "FP32", "shape": [-1, 10]}],
    }
    assert cfg.version_policy == ("all", [])
    assert any(w.startswith("model_warmup ignored") for w in cfg.warnings), cfg.warnings
    assert any("instance_group kind" in w for w in cfg.warnings), cfg.warnings


def test_pbtxt_without_batching_keeps_dims_and_without_dynamic_batching_does_not_batch():
    opts = parse_pbtxt('input [{name: "a", data_type: TYPE_STRING, dims: [-1, 2]}]\n'
                       'output [{name: "b", data_type: TYPE_INT64, dims: [3]}]').options.manifest_options()
    assert opts["inputs"] == [{"name": "a", "datatype": "BYTES", "shape": [-1, 2]}]
    assert opts["outputs"] == [{"name": "b", "datatype": "INT64", "shape": [3]}]
    assert opts["max_batch_size"] == 0 and "dynamic_batching" not in opts
    opts = parse_pbtxt("max_batch_size: 4").options.manifest_options()
    assert opts["dynamic_batching"] == {"enabled": False}  # Triton batches only what clients send


@pytest.mark.parametrize(("text", "reason"), [
    ('platform: "ensemble"', "ensemble"),
    ('ensemble_scheduling { step [ { model_name: "a" model_version: -1 } ] }', "ensemble"),
    ('backend: "python"', "backend 'python'"),
    ('backend: "tensorflow"', "backend 'tensorflow'"),
    ('platform: "tensorrt_plan"', "platform 'tensorrt_plan'"),
    ("sequence_batching { }", "sequence_batching"),
    ("model_transaction_policy { decoupled: true }", "decoupled"),
    ('input [{name: "a" data_type: TYPE_FP32 dims: [1] reshape { shape: [] }}]', "input.reshape"),
    ('input [{name: "a" data_type: TYPE_FP32 dims: [1] optional: true}]', "optional"),
    ('input [{name: "a" data_type: TYPE_BF16 dims: [1]}]', "BF16"),
    ("max_batch_size: 2\ndynamic_batching { priority_levels: 2 priority_queue_policy { key: 1 value { max_queue_size: 3 } } }",
     "priority_queue_policy"),
])
def test_unsupported_triton_features_are_refused_by_name(text, reason):
    with pytest.raises(TritonConfigError) as ei:
        parse_pbtxt(text, "m/config.pbtxt")
    assert ei.value.refused and reason in str(ei.value) and "m/config.pbtxt" in str(ei.value), str(ei.value)


def test_syntax_errors_give_the_line():
    with pytest.raises(TritonConfigError) as ei:
        parse_pbtxt('max_batch_size: 4\ninput [ { name: "x" data_type: TYPE_FLOAT } ]')
    assert not ei.value.refused and "2:" in str(ei.value) and "TYPE_FLOAT" in str(ei.value)


TRITON_FIELDS = r"""
import json
from tritonclient.grpc import model_config_pb2 as mc
print(json.dumps({m: list(getattr(mc, m).DESCRIPTOR.fields_by_name) for m in
                  ("ModelConfig", "ModelInput", "ModelOutput", "ModelInstanceGroup", "ModelDynamicBatching")}))
"""


def test_every_triton_field_is_mapped_refused_or_ignored():
    """Against Triton's own model_config.proto (shipped in tritonclient; read in a child process, as its
    descriptors clash with ours in one pool): no field of the messages we read falls through to 'unknown field',
    which is kept for typos."""
    from protos import model_config_pb2 as ours

    theirs = json.loads(subprocess.run([sys.executable, "-c", TRITON_FIELDS], capture_output=True, text=True,
                                       check=True, timeout=60).stdout)
    prefixes = {"ModelConfig": "", "ModelInput": "input.", "ModelOutput": "output.",
                "ModelInstanceGroup": "instance_group.", "ModelDynamicBatching": "dynamic_batching."}
    missing = []
    for message, names in theirs.items():
        known = set(getattr(ours, message).DESCRIPTOR.fields_by_name)
        missing += [prefixes[message] + n for n in names
                    if n not in known and prefixes[message] + n not in REFUSED and prefixes[message] + n not in IGNORED]
    assert missing == [], f"Triton fields neither mapped, refused nor ignored: {missing}"
