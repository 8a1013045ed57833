"""The generated code is fresh, and every field we define has the number and type of the published
definitions (Triton's own copy of grpc_service.proto and model_config.proto, shipped in tritonclient)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from protos import generate
from protos import grpc_service_pb2, model_config_pb2

ROOT = Path(__file__).resolve().parents[2]

DUMP = r"""
import json, sys
from tritonclient.grpc import service_pb2, model_config_pb2
out = {}
def walk(d, prefix):
    for m in d.message_types_by_name.values() if hasattr(d, "message_types_by_name") else d.nested_types:
        name = prefix + m.name
        out[name] = {f.name: [f.number, f.type, f.label if hasattr(f, "label") else 0] for f in m.fields}
        walk(m, name + ".")
for mod in (service_pb2, model_config_pb2):
    walk(mod.DESCRIPTOR, "")
methods = {m.name: [m.input_type.full_name, m.output_type.full_name]
           for m in service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods}
print(json.dumps({"messages": out, "methods": methods}))
"""


def _ours():
    out = {}

    def walk(container, prefix):
        types = container.message_types_by_name.values() if hasattr(container, "message_types_by_name") else container.nested_types
        for m in types:
            name = prefix + m.name
            out[name] = {f.name: [f.number, f.type, f.label if hasattr(f, "label") else 0] for f in m.fields}
            walk(m, name + ".")

    walk(grpc_service_pb2.DESCRIPTOR, "")
    walk(model_config_pb2.DESCRIPTOR, "")
    return out


def test_generated_code_is_fresh(tmp_path):
    generate.generate(tmp_path)
    for f in sorted((tmp_path / "protos").iterdir()):
        committed = ROOT / "protos" / f.name
        assert committed.exists(), f"{f.name} is generated but not committed: run `make protos`"
        assert committed.read_text() == f.read_text(), f"protos/{f.name} is stale: run `make protos`"


def test_fields_match_the_published_definitions():
    # tritonclient's protobuf registry clashes with ours in one process: read it in another
    theirs = json.loads(subprocess.run([sys.executable, "-c", DUMP], capture_output=True, text=True, check=True).stdout)
    ours = _ours()
    checked = 0
    for msg, fields in ours.items():
        if msg.endswith("Entry"):  # map entries
            continue
        assert msg in theirs["messages"], f"message {msg} is not in the published definitions"
        for name, (num, typ, _label) in fields.items():
            assert name in theirs["messages"][msg], f"{msg}.{name} is not in the published definitions"
            tnum, ttyp, _ = theirs["messages"][msg][name]
            assert (num, typ) == (tnum, ttyp), f"{msg}.{name}: ours is #{num} type {typ}, published #{tnum} type {ttyp}"
            checked += 1
    assert checked > 100
    svc = grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    for m in svc.methods:
        assert theirs["methods"][m.name] == [m.input_type.full_name, m.output_type.full_name]
