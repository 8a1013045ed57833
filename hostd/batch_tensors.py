"""Merging the tensors of a batch's requests into one model input, and splitting the model's outputs back
into one answer per request, by rows and in batch order (rows never cross between requests).

Pure numpy, no I/O: the runner (hostd/batcher.py) calls it in a worker thread around the forward pass.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np

from ground.errors import Internal


class BatchItem(Protocol):
    """What a batched request carries (hostd.tensors.DecodedRequest has these fields)."""

    inputs: dict[str, np.ndarray]
    outputs: list[str]
    rows: int


def output_names(items: Sequence[BatchItem]) -> list[str]:
    """Every output any request asked for, first-asked first, without repeats."""
    names: list[str] = []
    for it in items:
        for n in it.outputs:
            if n not in names:
                names.append(n)
    return names


def merge_inputs(items: Sequence[BatchItem]) -> dict[str, np.ndarray]:
    """One input per name: the requests' arrays stacked along the first (batch) axis, in batch order."""
    if len(items) == 1:
        ins = items[0].inputs
        if all(v.flags.aligned for v in ins.values()):
            return ins
        # a tensor viewed in place in its request's bytes may be unaligned for its type: copied here, in the
        # worker thread (numpy copies without the GIL), not by the runtime or on the event loop
        return {k: v if v.flags.aligned else v.copy() for k, v in ins.items()}
    return {k: np.concatenate([it.inputs[k] for it in items]) for k in items[0].inputs}


def split_outputs(out: Mapping[str, np.ndarray], items: Sequence[BatchItem], model: str) -> list[dict[str, np.ndarray]]:
    """Each request's rows of each output it asked for. With more than one request, every output must have
    one row per input row (else the model cannot be batched: Internal)."""
    if len(items) == 1:
        return [{n: out[n] for n in items[0].outputs}]
    total = sum(it.rows for it in items)
    for n in output_names(items):
        if out[n].ndim == 0 or out[n].shape[0] != total:
            raise Internal(
                f"model {model!r}: output {n!r} has shape {list(out[n].shape)}, expected {total} rows; "
                "the model cannot be batched (set max_batch_size 0 in its manifest)"
            )
    results = []
    off = 0
    for it in items:
        r = it.rows
        results.append({n: out[n][off : off + r] for n in it.outputs})
        off += r
    return results
