"""Helpers the review found duplicated, now shared: ONNX splitting reads the protobuf framing through
ground/protowire.py (groups and invalid fields still declined); one warm-up input builder for the loader and
the upload check (importable without storage or catalog code); filesystem_bytes through shutil.disk_usage."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np

from ground.manifest import TensorSpec
from ground.protowire import encode_varint
from hostd.runtimes.base import warmup_inputs
from hostd.runtimes.onnx_split import split_initializers
from hostd.server import filesystem_bytes
from tests.hostd.test_onnx_split import _mixed_model


def test_splitting_declines_groups_and_invalid_field_numbers():
    data = _mixed_model()
    assert split_initializers(data, "w") is not None
    group = encode_varint(20 << 3 | 3) + encode_varint(20 << 3 | 4)  # an (empty, balanced) group, field 20
    assert split_initializers(group + data, "w") is None, "groups are not in onnx.proto"
    assert split_initializers(encode_varint(0 << 3 | 0) + b"\x01" + data, "w") is None, "field number 0"
    assert split_initializers(data + encode_varint(21 << 3 | 6), "w") is None, "wire type 6"
    assert split_initializers(data + encode_varint(21 << 3 | 5) + b"\x00\x00", "w") is None, "truncated fixed32"


def test_warmup_inputs_are_zeros_of_batch_one():
    got = warmup_inputs([TensorSpec(name="x", datatype="FP16", shape=[-1, 3, -1]),
                         TensorSpec(name="s", datatype="BYTES", shape=[-1, 2]),
                         TensorSpec(name="b", datatype="BOOL", shape=[4])])
    assert got["x"].shape == (1, 3, 1) and got["x"].dtype == np.float16 and not got["x"].any()
    assert got["s"].shape == (1, 2) and got["s"].dtype == object and list(got["s"].ravel()) == [b"", b""]
    assert got["b"].shape == (4,) and got["b"].dtype == np.bool_


def test_the_upload_check_imports_no_storage_or_catalog_code():
    code = ("import sys, hostd.validate; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'storage_adapters', 'catalog', 'boto3', 'redis'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"


def test_filesystem_bytes_reads_the_nearest_existing_folder(tmp_path):
    got = filesystem_bytes(tmp_path / "not" / "made" / "yet")
    st = os.statvfs(tmp_path)
    assert got is not None
    free, total = got
    assert total == st.f_blocks * st.f_frsize
    assert abs(free - st.f_bavail * st.f_frsize) < 1 << 30  # others write meanwhile
