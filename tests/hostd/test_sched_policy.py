"""Fair execution policy on synthetic requests, no clock."""

from hostd.sched_policy import FairShare, SlotRequest


def run(policy: FairShare, waiting: list[SlotRequest], weights: dict[str, float], n: int) -> list[SlotRequest]:
    out = []
    for _ in range(n):
        r = policy.choose(waiting)
        if r is None:
            break
        waiting.remove(r)
        policy.charge(r, weights.get(r.tenant, 1.0))
        out.append(r)
    return out


def test_flooding_tenant_gets_its_share_not_more():
    noisy = [SlotRequest(seq=i, tenant="noisy", arrival=i) for i in range(100)]
    quiet = [SlotRequest(seq=1000 + i, tenant="quiet", arrival=50 + i) for i in range(10)]
    order = run(FairShare(), noisy + quiet, {}, 40)
    # equal weights: once quiet has work, the two alternate
    assert [r.tenant for r in order[:6]].count("quiet") == 3


def test_weights_split_slots_proportionally():
    a = [SlotRequest(seq=i, tenant="a", arrival=0) for i in range(300)]
    b = [SlotRequest(seq=1000 + i, tenant="b", arrival=0) for i in range(300)]
    order = run(FairShare(), a + b, {"a": 3.0, "b": 1.0}, 200)
    share_a = sum(r.tenant == "a" for r in order) / len(order)
    assert abs(share_a - 0.75) < 0.02


def test_quiet_tenant_waits_behind_at_most_one_batch():
    p = FairShare()
    noisy = [SlotRequest(seq=i, tenant="noisy", arrival=0, cost=0.05) for i in range(50)]
    run(p, noisy, {}, 20)  # noisy has been served a lot: its finish is far ahead
    late = SlotRequest(seq=999, tenant="quiet", arrival=10)
    assert p.choose(noisy + [late]) is late


def test_costly_batches_count_more():
    waiting = [SlotRequest(seq=i, tenant="heavy", arrival=0, cost=0.010) for i in range(50)]
    waiting += [SlotRequest(seq=100 + i, tenant="light", arrival=0, cost=0.001) for i in range(50)]
    order = run(FairShare(), waiting, {}, 22)
    assert sum(r.tenant == "light" for r in order) >= 18  # equal time, not equal counts


def test_priority_one_first_within_a_tenant():
    waiting = [SlotRequest(seq=1, tenant="t", priority=2, arrival=0), SlotRequest(seq=2, tenant="t", priority=1, arrival=5)]
    assert FairShare().choose(waiting).seq == 2


def test_empty():
    assert FairShare().choose([]) is None


def test_unit_model_shares_a_tenants_slots_among_its_models():
    hot = [SlotRequest(seq=i, tenant="t", arrival=i, model="hot") for i in range(50)]
    quiet = SlotRequest(seq=999, tenant="t", arrival=60, model="quiet")
    by_model = FairShare(unit="model")
    run(by_model, list(hot), {}, 10)  # the hot model has been served a lot within its tenant
    assert by_model.choose(hot[10:] + [quiet]) is quiet  # next, though it arrived last
    by_tenant = FairShare(unit="tenant")
    run(by_tenant, list(hot), {}, 10)
    assert by_tenant.choose(hot[10:] + [quiet]) is hot[10]  # unit tenant: arrival order within the tenant


def test_unit_model_keeps_tenant_weights_first():
    a = [SlotRequest(seq=i, tenant="a", arrival=0, model=f"a{i % 3}") for i in range(300)]
    b = [SlotRequest(seq=1000 + i, tenant="b", arrival=0, model="b") for i in range(300)]
    order = run(FairShare(unit="model"), a + b, {"a": 3.0, "b": 1.0}, 200)
    assert abs(sum(r.tenant == "a" for r in order) / len(order) - 0.75) < 0.02
    models = [r.model for r in order if r.tenant == "a"]
    assert max(models.count(m) for m in ("a0", "a1", "a2")) - min(models.count(m) for m in ("a0", "a1", "a2")) <= 1


def test_per_model_cap_keeps_one_slot_for_other_models():
    from hostd.sched_policy import per_model_cap

    assert per_model_cap(1) == 1 and per_model_cap(2) == 1 and per_model_cap(4) == 3
    assert per_model_cap(float("inf")) == float("inf")
    assert per_model_cap(4, 4) == 4 and per_model_cap(4, 9) == 4 and per_model_cap(4, 2) == 2
