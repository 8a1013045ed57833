"""The asyncio shell over the host's batch dispatch (hostd/core/dispatch.py: every model's queue and the
host's execution slots, granted fairly across tenants). Runners register here; a runner's kick or finished
batch asks the core for a step, and this shell hands each runner its part (batches to start, requests that
expired or timed out, when to plan again, which batch runs wide). Slot waits go to a metric. With a
`LoopIdle` (ground/loopidle.py), a wide batch that a request's arrival started while the loop had been idle
runs on the loop thread (`run_here`); one started by a finished batch never does: the finished batch's
answers still wait on the loop to be sent.

A worker thread that finishes a batch may start its model's next batch itself (`continues`, on by default):
it takes the core's finish step under the core's lock, keeps its own model's first started batch and runs it
at once, and posts the rest of the step (other models' batches, expiries, timers) with its answers to the
loop. Handing the next batch back through the loop cost a thread wake-up per batch (docs/execution.md item
13). Every other entry into the core (kick, finish, add, remove; the runners' queue changes) holds the
same lock, so the loop and the workers see one state. Nothing inside the lock calls back out."""

from __future__ import annotations

import math
import threading
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
                 unit: FairUnit = "tenant", wide_max_s: float = 0.0, loop_idle: LoopIdle | None = None,
                 continues: bool = True) -> None:
        """`slots`: batches running at once on the host (math.inf: no host-wide limit); `per_model`: slots
        one model may hold (0 = all but one); `unit`: the fairness unit (hostd.sched_policy); `wide_max_s`:
        the longest estimated lone batch of one request that runs wide, on every core (0: none;
        hostd/core/dispatch.py); `loop_idle`: the event loop's idle signal (None: wide batches run on worker
        threads like every other); `continues`: a worker thread that finished a batch starts its model's next
        one itself (`finish_here`)."""
        self.core = Dispatcher(ExecutionSlots(slots, weight, per_model=per_model, unit=unit),
                               lambda runner, n: runner.cost_estimate(n), wide_max_s)
        self._clock = clock
        self._on_wait = on_wait
        self._loop_idle = loop_idle
        self._finishing = 0  # inside finish: batches it starts run on worker threads
        self.lock = threading.Lock()  # the core's state, shared by the loop and the workers that continue
        self.continues = continues

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
        with self.lock:
            self.core.add(runner, runner.queue, runner.tenant, runner.can_run_wide)

    def remove(self, runner: ModelRunner) -> None:
        with self.lock:
            self.core.remove(runner)

    def kick(self, runner: ModelRunner) -> None:
        now = self._clock()
        with self.lock:
            step = self.core.kick(runner, now)
        self._apply(step, now)

    def finish(self, runner: ModelRunner, requests: int) -> None:
        now = self._clock()
        with self.lock:
            step = self.core.finish(runner, requests, now)
        self.apply_finished(step, now)

    def finish_here(self, runner: ModelRunner, requests: int) -> tuple[Step, float, tuple[int, ...] | None, bool]:
        """In a worker thread: the runner's batch of `requests` finished. Returns the step, its time, and the
        runner's own next batch taken out of it (None: none started), with whether it runs wide; the caller
        runs that batch and hands the rest to `apply_finished` on the loop."""
        now = self._clock()
        with self.lock:
            step = self.core.finish(runner, requests, now)
        for i, (r, seqs) in enumerate(step.started):
            if r is runner:
                del step.started[i]
                wide = step.wide.get(runner) == seqs
                if wide:
                    del step.wide[runner]
                return step, now, seqs, wide
        return step, now, None, False

    def apply_finished(self, step: Step, now: float | None = None) -> None:
        """On the loop: carry out a finish step (batches it starts there run on worker threads). `now`: when
        it was taken (None: a worker took it and posted it, so its batches start and its timers count from now)."""
        self._finishing += 1
        try:
            self._apply(step, self._clock() if now is None else now)
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
