"""Seeded random corruptions of a serialized message, for tests that check a hand-written wire scanner against
protobuf's parser: bytes overwritten, cut out, truncated or inserted, one to three edits a body."""

from __future__ import annotations

import random
from collections.abc import Iterator


def mutated(base: bytes, n: int, seed: int) -> Iterator[bytes]:
    rng = random.Random(seed)
    for _ in range(n):
        b = bytearray(base)
        for _ in range(rng.randint(1, 3)):
            op, k = rng.random(), rng.randrange(len(b) + 1)
            if op < 0.4 and k < len(b):
                b[k] = rng.randrange(256)
            elif op < 0.6:
                del b[k:k + rng.randint(1, 5)]
            elif op < 0.8:
                del b[k:]
            else:
                b[k:k] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 4)))
        yield bytes(b)
