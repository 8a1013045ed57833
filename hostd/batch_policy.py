"""Batch formation as a pure function of (queue, now): form this batch now, or wait until a time.

No clock, no I/O: hostd/core/queue.py drives exactly this code, for hostd's runner and sim/ alike.

Rules, in order:
1. A request whose deadline has passed is expired (answered DEADLINE_EXCEEDED, never executed). A request
   whose queue timeout passed is rejected (action "reject") or sinks below every other request ("delay").
2. Nothing runs without a free executor.
3. Requests are served by priority level (1 is highest; larger is lower), then arrival order. A batch holds
   the first request and the following ones with the same non-batch shapes, up to max_batch_size rows.
4. With max_queue_delay == 0 the batch runs at once: batches grow only while executors are busy, so
   batching adds no idle waiting at low load. With a positive delay the batch runs once it is full, once it
   reaches a preferred size, or once its oldest request has waited max_queue_delay; otherwise wait.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

INF = float("inf")


@dataclass(frozen=True, slots=True)
class Pending:
    seq: int
    arrival: float
    rows: int = 1
    shape_key: Hashable = ()
    priority: int = 1
    deadline: float = INF
    queue_timeout_at: float = INF
    delay_on_timeout: bool = False


@dataclass(frozen=True, slots=True)
class BatchConfig:
    max_batch_size: int = 0  # 0: the model does not batch; one request per execution
    max_queue_delay: float = 0.0  # seconds
    preferred_sizes: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class BatchDecision:
    run: tuple[int, ...] = ()  # seqs forming one batch to execute now, in batch order
    expired: tuple[int, ...] = ()  # deadline passed: drop, answer DEADLINE_EXCEEDED
    rejected: tuple[int, ...] = ()  # queue timeout passed with action "reject"
    wake_at: float | None = None  # decide again at this time if nothing else happens first


def _order(p: Pending, now: float) -> tuple[float, int]:
    sunk = p.delay_on_timeout and p.queue_timeout_at <= now
    return (INF if sunk else p.priority, p.seq)


def decide(queue: Sequence[Pending], now: float, free_executors: int, cfg: BatchConfig) -> BatchDecision:
    expired: list[int] = []
    rejected: list[int] = []
    live: list[Pending] = []
    next_event = INF
    for p in queue:
        if p.deadline <= now:
            expired.append(p.seq)
        elif p.queue_timeout_at <= now and not p.delay_on_timeout:
            rejected.append(p.seq)
        else:
            live.append(p)
            next_event = min(next_event, p.deadline)
            if p.queue_timeout_at > now:
                next_event = min(next_event, p.queue_timeout_at)

    def done(run: tuple[int, ...] = (), wake: float = INF) -> BatchDecision:
        w = min(wake, next_event)
        return BatchDecision(run, tuple(expired), tuple(rejected), None if w == INF else w)

    if not live or free_executors <= 0:
        return done()

    live.sort(key=lambda p: _order(p, now))
    head = live[0]
    if cfg.max_batch_size <= 0:
        return done((head.seq,))

    batch: list[Pending] = []
    rows = 0
    for p in live:
        if p.shape_key != head.shape_key:
            continue
        if rows + p.rows > cfg.max_batch_size:
            break
        batch.append(p)
        rows += p.rows
    if not batch:  # head alone exceeds max_batch_size; validation should have refused it: run it alone
        return done((head.seq,))

    if rows >= cfg.max_batch_size or cfg.max_queue_delay <= 0:
        return done(tuple(p.seq for p in batch))

    if cfg.preferred_sizes:  # run the longest prefix that makes a preferred size, at once
        acc, best = 0, -1
        for i, p in enumerate(batch):
            acc += p.rows
            if acc in cfg.preferred_sizes:
                best = i
        if best >= 0:
            return done(tuple(p.seq for p in batch[: best + 1]))

    oldest = min(p.arrival for p in batch)
    if now >= oldest + cfg.max_queue_delay:  # the same sum as wake_at, so waking at wake_at runs it
        return done(tuple(p.seq for p in batch))
    return done(wake=oldest + cfg.max_queue_delay)
