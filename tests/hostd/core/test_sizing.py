"""Execution slots and runtime threads: running batches never oversubscribe the CPU's cores."""

from hostd.core.sizing import GPU_SLOTS, plan_execution


def test_auto_on_cpu_gives_each_slot_its_own_cores():
    for cores in (1, 2, 3, 4, 8, 16, 64):
        p = plan_execution(cores)
        assert p.slots * p.threads <= cores and not p.oversubscribed, (cores, p)
        assert p.slots == min(cores, GPU_SLOTS)
    assert (plan_execution(2).slots, plan_execution(2).threads) == (2, 1)
    assert (plan_execution(16).slots, plan_execution(16).threads) == (4, 4)


def test_one_setting_sizes_the_other():
    assert (plan_execution(8, slots=2).threads) == 4
    assert (plan_execution(8, threads=2).slots) == 4
    assert plan_execution(2, threads=8).threads == 2  # at most the cores


def test_explicit_settings_that_oversubscribe_are_lowered_and_said():
    p = plan_execution(2, slots=2, threads=2)
    assert (p.slots, p.threads) == (2, 1) and "4" not in p.note.split(">")[1] and p.oversubscribed
    p = plan_execution(2, slots=4, threads=1)
    assert (p.slots, p.threads) == (4, 1) and p.oversubscribed and "still oversubscribe" in p.note
    assert not plan_execution(4, slots=2, threads=2).oversubscribed


def test_gpu_slots_and_one_feeding_thread():
    p = plan_execution(2, "cuda")
    assert (p.slots, p.threads) == (GPU_SLOTS, 1)
    assert plan_execution(2, "cuda", slots=8, threads=2).slots == 8


def test_a_lone_batch_may_use_every_core_where_a_slot_has_fewer():
    assert all(plan_execution(n, wide=True).wide == n for n in (2, 16, 64))
    assert plan_execution(2).wide == 0  # off unless asked (wide_lone_batches)
    assert plan_execution(1, wide=True).wide == 0  # one slot has every core already
    assert plan_execution(4, slots=1, wide=True).wide == 0
    assert plan_execution(2, slots=2, threads=2, wide=True).wide == 0  # lowered settings: left as they are
    assert plan_execution(2, "cuda", wide=True).wide == 0
