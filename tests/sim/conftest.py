"""Helpers for building tiny hand-checked workloads."""

from __future__ import annotations

import numpy as np
import pytest

from sim.costs import CostModel
from sim.workload import ModelSpec, Workload


def make_workload(seq: list[str], sizes: dict[str, int], tenant_of=lambda name: "t") -> Workload:
    names = list(dict.fromkeys(seq)) + [n for n in sizes if n not in seq]
    index = {n: i for i, n in enumerate(names)}
    models = [ModelSpec(f"{tenant_of(n)}/{n}/1", tenant_of(n), sizes[n]) for n in names]
    return Workload(models, np.arange(len(seq), dtype=np.float64), np.array([index[s] for s in seq], dtype=np.int64))


@pytest.fixture
def unit_costs() -> CostModel:
    """Every load takes 1 s from any tier: load time == number of loads."""
    return CostModel(load_fixed_s=1.0, load_s_per_byte={"storage": 0.0, "disk": 0.0, "host_ram": 0.0})
