"""The event loop's idle signal (ground/loopidle.py): a lone batch may run on the loop thread only right after
the loop woke from a real wait, once per wake; a loop that had I/O waiting (a backlog of calls) never qualifies."""

from __future__ import annotations

import asyncio
import socket
import time

from ground.loopidle import LoopIdle, idle_loop_factory


def test_a_wake_from_a_real_wait_is_taken_once_and_only_while_fresh():
    idle = LoopIdle(idle_min_s=0.001, fresh_s=0.002)
    assert not idle.take(0.0)  # the loop never waited
    idle.waited(1.0, 1.0005)  # shorter than idle_min: a hand-off, not idle
    assert not idle.take(1.0006)
    idle.waited(2.0, 2.01)
    assert idle.take(2.011)
    assert not idle.take(2.0111)  # one batch per wake: never a chain
    idle.waited(3.0, 3.01)
    assert not idle.take(3.0125)  # the wake is 2.5 ms old: the request took too long to get here
    idle.waited(4.0, 4.01)
    assert idle.take(4.01)


def test_on_a_real_loop_only_a_wait_with_nothing_to_do_counts():
    idle = LoopIdle(idle_min_s=0.005, fresh_s=0.5)
    taken: dict[str, bool] = {}

    async def main() -> None:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(0.02)  # the loop waits 20 ms with nothing to do
        taken["after a wait"] = idle.take(time.monotonic())
        a, b = socket.socketpair()
        try:
            a.setblocking(False)
            b.setblocking(False)
            ready = asyncio.Event()
            loop.add_reader(a, lambda: (a.recv(64), ready.set()))
            await asyncio.sleep(0.02)
            idle.take(time.monotonic())  # spend that wake
            b.send(b"x")  # a call arrives while the loop is busy: it is waiting when the loop next looks
            time.sleep(0.01)
            await ready.wait()
            taken["with I/O already waiting"] = idle.take(time.monotonic())
            for _ in range(50):
                await asyncio.sleep(0)  # polls with work ready: never a wait
            taken["after polls"] = idle.take(time.monotonic())
        finally:
            loop.remove_reader(a)
            a.close()
            b.close()

    with asyncio.Runner(loop_factory=idle_loop_factory(idle)) as runner:
        runner.run(main())
    assert taken == {"after a wait": True, "with I/O already waiting": False, "after polls": False}


def test_a_loop_without_the_selector_never_reports_idle():
    idle = LoopIdle(idle_min_s=0.001, fresh_s=1.0)

    async def main() -> bool:
        await asyncio.sleep(0.02)
        return idle.take(time.monotonic())

    assert asyncio.run(main()) is False
