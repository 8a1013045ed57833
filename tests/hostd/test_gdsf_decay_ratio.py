"""gdsf-decay (hostd/cache/policy.py) computes log(cost / size) once per key and again only when the size or
the load cost it is told changes: a model measured bigger, or dearer to load again, moves in the order."""

from __future__ import annotations

import math

from hostd.cache.policy import DecayedGDSFPolicy, Resident

MB = 1 << 20


def _policy() -> DecayedGDSFPolicy:
    return DecayedGDSFPolicy(min_half_life=100, half_life_per_resident=0)


def test_a_new_size_or_cost_moves_the_model():
    p = _policy()
    for k in ("a", "b"):
        p.on_access(k, 0.0, MB, 1.0)
    p.on_access("a", 0.0, MB, 1.0)
    assert list(p.victims()) == ["b", "a"]
    p.on_access("a", 0.0, 64 * MB, 1.0)  # measured much bigger now: worth less per byte
    assert list(p.victims()) == ["a", "b"]
    p.on_access("a", 0.0, 64 * MB, 500.0)  # and far dearer to load again
    assert list(p.victims()) == ["b", "a"]


def test_priorities_are_what_the_formula_says_and_what_sync_rebuilds():
    p = _policy()
    seq = [("a", MB, 1.0), ("b", 2 * MB, 3.0), ("a", MB, 1.0), ("c", MB, 0.5), ("b", 4 * MB, 3.0), ("a", MB, 2.0)]
    for k, size, cost in seq:
        p.on_access(k, 0.0, size, cost)
    last = {k: (size, cost) for k, size, cost in seq}
    for k, (size, cost) in last.items():
        f, at = p.history[k]
        want = math.log(f) + math.log(cost / size) + math.log(2.0) * at / p.half_life
        assert p._prio[k] == want
    order = list(p.victims())
    q = _policy()
    q.history = dict(p.history)
    q.t = p.t
    q.sync([Resident(k, "t", size, last_use=i, load_cost=cost, hits=1) for i, (k, (size, cost)) in enumerate(last.items())])
    assert list(q.victims()) == order
