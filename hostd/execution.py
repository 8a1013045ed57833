"""The asyncio shell over the host's batch dispatch (hostd/core/dispatch.py: every model's queue and the
host's execution slots, granted fairly across tenants). Runners register here; a runner's kick or finished
batch asks the core for a step, and this shell hands each runner its part (batches to start, requests that
expired or timed out, when to plan again, which batch runs wide). Slot waits go to a metric. With a
`LoopIdle` (ground/loopidle.py), a wide batch that a request's arrival started while the loop had been idle
runs on the loop thread (`run_here`); one started by a finished batch never does: the finished batch's
answers still wait on the loop to be sent."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ground.loopidle import LoopIdle
from hostd.core.dispatch import Dispatcher, Step
from hostd.core.slots import ExecutionSlots
from hostd.sched_policy import FairUnit

if TYPE_CHECKING:
    from hostd.batcher import ModelRunner


class ExecutionGate:
    def __init__(self, slots: float, weight: Callable[[str], float] = lambda tenant: 1.0,
                 clock: Callable[[], float] = time.monotonic,
                 on_wait: Callable[[str, float], None] | None = None, *, per_model: int = 0,
                 unit: FairUnit = "tenant", wide_max_s: float = 0.0, loop_idle: LoopIdle | None = None) -> None:
        """`slots`: batches running at once on the host (math.inf: no host-wide limit); `per_model`: slots
        one model may hold (0 = all but one); `unit`: the fairness unit (hostd.sched_policy); `wide_max_s`:
        the longest estimated lone batch of one request that runs wide, on every core (0: none;
        hostd/core/dispatch.py); `loop_idle`: the event loop's idle signal (None: wide batches run on worker
        threads like every other)."""
        self.core = Dispatcher(ExecutionSlots(slots, weight, per_model=per_model, unit=unit),
                               lambda runner, n: runner.cost_estimate(n), wide_max_s)
        self._clock = clock
        self._on_wait = on_wait
        self._loop_idle = loop_idle
        self._finishing = 0  # inside finish: batches it starts run on worker threads

    @classmethod
    def unlimited(cls, clock: Callable[[], float] = time.monotonic) -> ExecutionGate:
        """For a runner without a host gate: its own executors are the only limit."""
        return cls(math.inf, clock=clock)

    @property
    def slots(self) -> float:
        return self.core.slots.slots

    @property
    def free(self) -> float:
        return self.core.slots.free

    @property
    def waiting(self) -> int:
        return self.core.slots.waiting

    def add(self, runner: ModelRunner) -> None:
        self.core.add(runner, runner.queue, runner.tenant, runner.can_run_wide)

    def remove(self, runner: ModelRunner) -> None:
        self.core.remove(runner)

    def kick(self, runner: ModelRunner) -> None:
        now = self._clock()
        self._apply(self.core.kick(runner, now), now)

    def finish(self, runner: ModelRunner, requests: int) -> None:
        now = self._clock()
        self._finishing += 1
        try:
            self._apply(self.core.finish(runner, requests, now), now)
        finally:
            self._finishing -= 1

    def run_here(self) -> bool:
        """May the wide batch being started run on the event loop thread: a request's arrival started it (not
        a finished batch, whose answers wait on the loop) right after the loop woke from idle."""
        return self._loop_idle is not None and not self._finishing and self._loop_idle.take(self._clock())

    def _apply(self, step: Step, now: float) -> None:
        if self._on_wait is not None:
            for tenant, waited in step.waits:
                self._on_wait(tenant, waited)
        parts: dict[ModelRunner, tuple[list, list, list]] = {}
        for r, seqs in step.started:
            parts.setdefault(r, ([], [], []))[0].append(seqs)
        for r, seq in step.expired:
            parts.setdefault(r, ([], [], []))[1].append(seq)
        for r, seq in step.rejected:
            parts.setdefault(r, ([], [], []))[2].append(seq)
        for r in step.wake:
            parts.setdefault(r, ([], [], []))
        for r, (started, expired, rejected) in parts.items():
            r.apply(started, expired, rejected, step.wake.get(r), now, step.wide.get(r))
