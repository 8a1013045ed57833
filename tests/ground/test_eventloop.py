"""ground/eventloop.py: the loop factory gives the kind asked for, and the asyncio kind can be hostd's own."""

from __future__ import annotations

import asyncio

import pytest

from ground import eventloop


async def _kind() -> str:
    return eventloop.loop_kind(asyncio.get_running_loop())


def test_each_kind_runs_a_coroutine_on_that_loop():
    assert eventloop.run(_kind(), "uvloop") == "uvloop"
    assert eventloop.run(_kind(), "asyncio") == "asyncio"


def test_the_asyncio_kind_uses_the_factory_given():
    made: list[asyncio.AbstractEventLoop] = []

    def factory() -> asyncio.AbstractEventLoop:
        made.append(asyncio.new_event_loop())
        return made[-1]

    async def running() -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    assert eventloop.run(running(), "asyncio", factory) is made[0]
    assert eventloop.run(_kind(), "uvloop", factory) == "uvloop" and len(made) == 1  # uvloop ignores it


def test_an_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="unknown event loop 'trio'"):
        eventloop.loop_factory("trio")  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["uvloop", "asyncio"])
def test_the_path_without_asyncio_runner_runs_on_the_kind_and_closes_its_loop(kind):
    """Python 3.10 has no asyncio.Runner: `run` takes this path there (CI runs 3.11, so it is called directly)."""
    loops: list[asyncio.AbstractEventLoop] = []
    finished: list[bool] = []

    async def gen():
        try:
            yield 1
            yield 2
        finally:
            finished.append(True)

    async def main() -> str:
        loops.append(asyncio.get_running_loop())

        agen = gen()
        await agen.__anext__()  # left open: the path's shutdown_asyncgens finishes it
        return eventloop.loop_kind(loops[0])

    assert eventloop.run_without_runner(main(), eventloop.loop_factory(kind)) == kind
    assert loops[0].is_closed() and finished == [True]
    with pytest.raises(RuntimeError):
        asyncio.get_event_loop_policy().get_event_loop()  # the path unset the loop it had set
