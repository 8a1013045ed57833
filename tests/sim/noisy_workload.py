"""The simulated noisy-neighbour workload the host-core and placement tests share: a noisy model (640 requests
at t=2, 10 ms per batch of up to 32) and a light one of another tenant (0.1 ms per batch, one request every
50 ms from t=2.0005), both loaded by t=2."""

from __future__ import annotations

import numpy as np

from sim.costs import ComputeCost, CostModel
from sim.workload import ModelSpec, Workload


def noisy_beside_light() -> tuple[Workload, CostModel]:
    specs = [ModelSpec("noisy/m/1", "noisy", 10), ModelSpec("light/m/1", "light", 10)]
    light_ts = [2.0005 + 0.05 * k for k in range(4)]
    times = [0.0, 0.0] + [2.0] * 640 + light_ts
    models = [0, 1] + [0] * 640 + [1] * len(light_ts)
    order = np.argsort(times, kind="stable")
    wl = Workload(specs, np.array(times)[order], np.array(models, dtype=np.int64)[order])
    costs = CostModel(load_fixed_s=0.5, load_s_per_byte={"storage": 0.0, "disk": 0.0, "host_ram": 0.0},
                      compute_default=ComputeCost(0.010, 0.0), compute={"light/m/1": ComputeCost(0.0001, 0.0)})
    return wl, costs
