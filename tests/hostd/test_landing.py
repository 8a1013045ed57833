"""The buffer a download lands in: exactly the file's size, writable in place (storage reads into it, hashing
reads slices of it), and it outlives the call that made it (the RAM tier and in-place ONNX weights keep it)."""

from __future__ import annotations

import gc
import hashlib

import numpy as np
import pytest

from hostd.loader import landing


@pytest.mark.parametrize("size", [0, 1, 4095, 4097, 5 << 20])
def test_a_landing_buffer_holds_exactly_the_bytes_written_into_it(size):
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    view = landing(size)
    assert len(view) == size and not view.readonly
    view[:] = data
    gc.collect()
    assert hashlib.sha256(view[: size // 2]).hexdigest() == hashlib.sha256(data[: size // 2]).hexdigest()
    assert np.frombuffer(view, np.uint8).tobytes() == data


def test_a_slice_kept_alone_keeps_its_bytes():
    view = landing(1 << 20)
    view[:] = b"\x07" * (1 << 20)
    tail = view[-10:]
    del view
    gc.collect()
    assert bytes(tail) == b"\x07" * 10
