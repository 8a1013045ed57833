"""How bench/sim_fidelity.py judges the targets (sim/fidelity_targets.py): gaps in points or per cent, the
median over repeated real runs on both sides, and each run's own verdict."""

import pytest

from sim.fidelity_targets import held_in, judge, median, run_spread


def fig(hit: float, p99: float, shed: float) -> dict[str, float]:
    return {"hit": hit, "p99": p99, "shed": shed}


def test_gaps_are_points_for_rates_and_per_cent_of_the_real_p99():
    v = {x.target.key: x for x in judge(fig(0.80, 40.0, 0.010), fig(0.83, 50.0, 0.035))}
    assert v["hit"].gap == pytest.approx(3.0) and v["hit"].held  # exactly at the limit holds
    assert v["p99"].gap == pytest.approx(25.0) and v["p99"].held  # relative to the real figure, not the sim's
    assert v["shed"].gap == pytest.approx(2.5) and not v["shed"].held
    low = {x.target.key: x for x in judge(fig(0.80, 40.0, 0.0), fig(0.80, 29.9, 0.0))}
    assert low["p99"].gap == pytest.approx(25.25) and not low["p99"].held


def test_the_sim_is_judged_on_medians_and_an_outlier_real_run_does_not_move_them():
    """Three real runs of one trace, p99 26, 36 and 80 ms (one with a neighbour's bench on the box): the median
    is 36; a mean (47.3) would fail a sim at 40 that is within 25% of two of the three runs."""
    reals = [fig(0.82, 26.0, 0.0), fig(0.83, 36.0, 0.0), fig(0.82, 80.0, 0.01)]
    sims = [fig(0.82, 33.0, 0.0), fig(0.82, 40.0, 0.0), fig(0.83, 41.0, 0.0)]
    real, sim = median(reals, ["hit", "p99", "shed"]), median(sims, ["hit", "p99", "shed"])
    assert real == {"hit": 0.82, "p99": 36.0, "shed": 0.0} and sim["p99"] == 40.0
    assert all(v.held for v in judge(real, sim))
    # each run's sim against its own run: p99 held in runs 2 (40 vs 36) only; 33 vs 26 is +27%, 41 vs 80 -49%
    assert held_in(reals, sims) == {"hit": 3, "p99": 1, "shed": 3}
    assert median(reals[:1], ["p99"]) == {"p99": 26.0}  # one run: its own figure


def test_the_spread_of_a_figure_over_runs():
    assert run_spread([29.6, 26.0, 36.0]) == (26.0, 36.0, pytest.approx(38.46, abs=0.01))
    with pytest.raises(ValueError):
        held_in([fig(0.8, 1.0, 0.0)], [])
