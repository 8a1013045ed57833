"""The batch policy on a virtual clock: no sleeping, time is just a number."""

from hostd.batch_policy import BatchConfig, Pending, decide

CFG = BatchConfig(max_batch_size=8)


def q(*items):
    return [Pending(seq=i, arrival=a, rows=r) for i, (a, r) in enumerate(items)]


def test_empty_queue_does_nothing():
    d = decide([], 10.0, 1, CFG)
    assert d.run == () and d.wake_at is None


def test_free_executor_runs_everything_queued_at_once_without_delay():
    d = decide(q((0.0, 1), (0.1, 1), (0.2, 1)), 0.2, 1, CFG)
    assert d.run == (0, 1, 2)
    assert d.wake_at is None


def test_no_free_executor_means_no_batch():
    d = decide(q((0.0, 1), (0.1, 1)), 5.0, 0, CFG)
    assert d.run == ()


def test_batch_respects_max_batch_size_in_rows():
    d = decide(q((0, 3), (0, 3), (0, 3)), 1.0, 1, CFG)
    assert d.run == (0, 1)  # 6 rows; a third would make 9 > 8


def test_only_same_shapes_batch_together():
    queue = [
        Pending(seq=0, arrival=0, shape_key=("a",)),
        Pending(seq=1, arrival=0, shape_key=("b",)),
        Pending(seq=2, arrival=0, shape_key=("a",)),
    ]
    assert decide(queue, 1.0, 1, CFG).run == (0, 2)


def test_delay_waits_for_the_oldest_request_then_runs():
    cfg = BatchConfig(max_batch_size=8, max_queue_delay=0.010)
    queue = q((1.000, 1), (1.004, 1))
    d = decide(queue, 1.005, 1, cfg)
    assert d.run == ()
    assert abs(d.wake_at - 1.010) < 1e-9
    d = decide(queue, 1.010, 1, cfg)
    assert d.run == (0, 1)


def test_waking_at_wake_at_runs_the_batch_despite_float_rounding():
    # (0.7 + 0.1) - 0.7 < 0.1 in floating point: comparing the waited time would wake at the same instant forever
    cfg = BatchConfig(max_batch_size=8, max_queue_delay=0.1)
    queue = q((0.7, 1))
    d = decide(queue, 0.7, 1, cfg)
    assert d.run == () and decide(queue, d.wake_at, 1, cfg).run == (0,)


def test_delay_does_not_hold_a_full_batch():
    cfg = BatchConfig(max_batch_size=4, max_queue_delay=1.0)
    d = decide(q((0, 2), (0, 2)), 0.0, 1, cfg)
    assert d.run == (0, 1)


def test_preferred_size_runs_at_once():
    cfg = BatchConfig(max_batch_size=16, max_queue_delay=1.0, preferred_sizes=(4,))
    d = decide(q((0, 1), (0, 1), (0, 1), (0, 1), (0, 1)), 0.0, 1, cfg)
    assert d.run == (0, 1, 2, 3)


def test_unbatched_model_runs_one_request():
    d = decide(q((0, 1), (0, 1)), 0.0, 2, BatchConfig(max_batch_size=0))
    assert d.run == (0,)


def test_priority_one_goes_first():
    queue = [Pending(seq=0, arrival=0, priority=2), Pending(seq=1, arrival=1, priority=1)]
    assert decide(queue, 2.0, 1, BatchConfig(max_batch_size=1)).run == (1,)


def test_expired_requests_are_dropped_not_run():
    queue = [Pending(seq=0, arrival=0, deadline=1.0), Pending(seq=1, arrival=0, deadline=9.0)]
    d = decide(queue, 2.0, 1, CFG)
    assert d.expired == (0,)
    assert d.run == (1,)


def test_expired_while_busy_still_reported_and_wake_at_next_deadline():
    queue = [Pending(seq=0, arrival=0, deadline=1.0), Pending(seq=1, arrival=0, deadline=9.0)]
    d = decide(queue, 2.0, 0, CFG)
    assert d.expired == (0,) and d.run == ()
    assert d.wake_at == 9.0


def test_queue_timeout_rejects_or_sinks():
    queue = [
        Pending(seq=0, arrival=0, queue_timeout_at=1.0),
        Pending(seq=1, arrival=0, queue_timeout_at=1.0, delay_on_timeout=True),
        Pending(seq=2, arrival=0.5),
    ]
    d = decide(queue, 2.0, 1, BatchConfig(max_batch_size=1))
    assert d.rejected == (0,)
    assert d.run == (2,)  # the delayed one sank below the fresh one
