"""The fidelity targets (#17) and how bench/sim_fidelity.py judges them: hit rate within 3 points, p99 within
25% of the real system's, shed rate within 2 points.

The real system's p99 moves from run to run on a shared box (three runs of one Zipf trace: 26.0, 36.0 and
29.6 ms, a spread wider than the 25% band), so one real run cannot tell a sim that holds from one that does
not. The bench can repeat the real run; each run is calibrated and simulated on its own, and the judgement
is on the median over the runs on both sides (`judge(median(reals), median(sims))`), with every run's own
judgement printed beside it (`held_in`). The median, not the mean: one run on a box another engineer's bench
briefly shares is an outlier the median does not follow.

Pure: figures in, verdicts out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Target:
    what: str
    key: str  # the figure: hit, p99 or shed
    limit: float
    unit: str  # "points": |sim - real| x 100; "%": |sim / real - 1| x 100


TARGETS = (Target("hit rate", "hit", 3.0, "points"), Target("p99", "p99", 25.0, "%"),
           Target("shed rate", "shed", 2.0, "points"))


@dataclass(frozen=True, slots=True)
class Verdict:
    target: Target
    gap: float  # in the target's unit

    @property
    def held(self) -> bool:
        return self.gap <= self.target.limit


def gap(t: Target, real: float, sim: float) -> float:
    if t.unit == "%":
        return abs(sim / real - 1) * 100 if real > 0 else (0.0 if sim == real else float("inf"))
    return abs(sim - real) * 100


def judge(real: Mapping[str, float], sim: Mapping[str, float]) -> list[Verdict]:
    """Each target's gap between the sim's figures and the real system's (fractions for hit and shed)."""
    return [Verdict(t, gap(t, real[t.key], sim[t.key])) for t in TARGETS]


def median(runs: Sequence[Mapping[str, float]], keys: Sequence[str]) -> dict[str, float]:
    """Each figure's median over the runs (with one run: its own)."""
    return {k: float(np.median([r[k] for r in runs])) for k in keys}


def held_in(reals: Sequence[Mapping[str, float]], sims: Sequence[Mapping[str, float]]) -> dict[str, int]:
    """Per target, in how many runs the sim calibrated from a run held against that run."""
    out = {t.key: 0 for t in TARGETS}
    for real, sim in zip(reals, sims, strict=True):
        for v in judge(real, sim):
            out[v.target.key] += v.held
    return out


def run_spread(values: Sequence[float]) -> tuple[float, float, float]:
    """(lowest, highest, highest / lowest - 1 in %) of one figure over the runs."""
    lo, hi = min(values), max(values)
    return lo, hi, (hi / lo - 1) * 100 if lo > 0 else float("inf")
