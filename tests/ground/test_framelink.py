"""ground/framelink.py's framing, on in-memory streams: a message comes back whole, a clean end between
messages is None, an end inside one is an error, and a length over the reader's limit is refused before any
of its bytes are read."""

from __future__ import annotations

import asyncio

import pytest

from ground.framelink import TooLarge, read_message


def _reader(data: bytes) -> asyncio.StreamReader:
    r = asyncio.StreamReader()  # made inside the loop that reads it
    r.feed_data(data)
    r.feed_eof()
    return r


async def _read(data: bytes, limit: int):
    return await read_message(_reader(data), limit)


def _framed(*messages: bytes) -> bytes:
    return b"".join(len(m).to_bytes(4, "little") + m for m in messages)


def test_messages_come_back_whole_and_a_clean_end_is_none():
    async def go():
        r = _reader(_framed(b"abc", b"", b"x" * 70_000))
        return [await read_message(r, 1 << 20) for _ in range(4)]


    assert asyncio.run(go()) == [b"abc", b"", b"x" * 70_000, None]


@pytest.mark.parametrize("data", [b"\x05\x00", _framed(b"hello")[:-2]])
def test_an_end_inside_a_message_is_an_error(data):
    with pytest.raises(asyncio.IncompleteReadError):
        asyncio.run(_read(data, 1 << 20))


def test_a_length_over_the_limit_is_refused():
    with pytest.raises(TooLarge) as e:
        asyncio.run(_read(_framed(b"y" * 101), 100))
    assert (e.value.size, e.value.limit) == (101, 100)
