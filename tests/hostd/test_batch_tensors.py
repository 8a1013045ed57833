"""Merging a batch's inputs and splitting the outputs back: rows never cross between requests."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from ground.errors import Internal
from hostd.batch_tensors import merge_inputs, output_names, split_outputs


@dataclass
class Req:
    inputs: dict[str, np.ndarray]
    outputs: list[str] = field(default_factory=lambda: ["y"])

    @property
    def rows(self) -> int:
        return next(iter(self.inputs.values())).shape[0]


def test_merge_then_split_gives_each_request_its_own_rows():
    reqs = [Req({"x": np.full((n, 3), i, np.float32)}) for i, n in enumerate((1, 3, 2))]
    merged = merge_inputs(reqs)
    assert merged["x"].shape == (6, 3)
    out = {"y": merged["x"] * 10}
    parts = split_outputs(out, reqs, "m")
    for i, (r, p) in enumerate(zip(reqs, parts, strict=True)):
        assert p["y"].shape == (r.rows, 3) and (p["y"] == 10 * i).all()


def test_one_request_passes_through_untouched():
    r = Req({"x": np.ones((2, 2))}, outputs=["y"])
    assert merge_inputs([r]) is r.inputs
    out = {"y": np.zeros(7), "z": np.ones(1)}  # any shape: nothing to split
    assert split_outputs(out, [r], "m") == [{"y": out["y"]}]


def test_each_request_gets_only_the_outputs_it_asked_for():
    a = Req({"x": np.zeros((1, 1))}, outputs=["y"])
    b = Req({"x": np.ones((1, 1))}, outputs=["z", "y"])
    assert output_names([a, b]) == ["y", "z"]
    parts = split_outputs({"y": np.arange(2), "z": np.arange(2) + 5}, [a, b], "m")
    assert list(parts[0]) == ["y"] and list(parts[1]) == ["z", "y"]
    assert parts[0]["y"].tolist() == [0] and parts[1]["z"].tolist() == [6]


@pytest.mark.parametrize("bad", [np.float32(1.0), np.zeros((3, 2))])
def test_an_output_without_one_row_per_input_row_cannot_be_batched(bad):
    reqs = [Req({"x": np.zeros((2, 1))}), Req({"x": np.zeros((2, 1))})]
    with pytest.raises(Internal, match="cannot be batched"):
        split_outputs({"y": np.asarray(bad)}, reqs, "m")


def test_an_unaligned_input_of_a_lone_request_is_copied_aligned():
    """A large request's tensors are views into its body at any offset (hostd/wire_request.py): the runtime
    gets an aligned copy, with the same values."""
    body = bytes(1) + np.arange(12, dtype=np.float32).tobytes()
    x = np.frombuffer(memoryview(body)[1:], dtype=np.float32).reshape(3, 4)
    assert not x.flags.aligned
    it = Req({"x": x})
    merged = merge_inputs([it])
    assert merged["x"].flags.aligned and merged["x"].flags.c_contiguous
    np.testing.assert_array_equal(merged["x"], np.arange(12, dtype=np.float32).reshape(3, 4))
