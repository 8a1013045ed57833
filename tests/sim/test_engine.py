from sim.engine import EventLoop


def test_events_run_in_time_order_and_ties_in_schedule_order():
    loop = EventLoop()
    seen = []
    loop.schedule(3.0, lambda: seen.append(("c", loop.now)))
    loop.schedule(1.0, lambda: seen.append(("a", loop.now)))
    loop.schedule(2.0, lambda: seen.append(("b1", loop.now)))
    loop.schedule(2.0, lambda: seen.append(("b2", loop.now)))
    assert loop.run() == 3.0
    assert seen == [("a", 1.0), ("b1", 2.0), ("b2", 2.0), ("c", 3.0)]
    assert loop.processed == 4 and len(loop) == 0


def test_events_scheduled_from_events_and_clock_never_goes_back():
    loop = EventLoop(start=10.0)
    seen = []

    def first():
        seen.append(loop.now)
        loop.after(0.5, lambda: seen.append(loop.now))
        loop.schedule(5.0, lambda: seen.append(("past", loop.now)))  # clamped to now

    loop.schedule(11.0, first)
    loop.run()
    assert seen == [11.0, ("past", 11.0), 11.5]


def test_run_until_stops_before_later_events():
    loop = EventLoop()
    seen = []
    for t in (1.0, 2.0, 5.0):
        loop.schedule(t, seen.append, t)
    assert loop.run(until=3.0) == 3.0
    assert seen == [1.0, 2.0] and len(loop) == 1
    loop.run()
    assert seen == [1.0, 2.0, 5.0] and loop.now == 5.0
