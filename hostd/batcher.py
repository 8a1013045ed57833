"""The per-model dynamic batcher: the asyncio shell around the core's model queue (hostd/core/queue.py).

Requests wait in the model's queue; whenever something changes (a request arrives, an executor frees up,
a timer fires) the runner asks the queue's plan what to do and does it. Executors are `instances`
concurrent runs of the model in worker threads (ONNX Runtime and torch release the GIL while computing).
With a host execution gate, a batch that could run first waits for a host slot. Merging inputs, the
forward pass and splitting outputs (hostd/batch_tensors.py) all happen in the worker thread, and the worker
that finished a batch starts its model's next one itself when the core starts one (hostd/execution.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np

from ground.served import Served
from ground.errors import DeadlineExceeded, Internal, ResourceExhausted, Unavailable
from hostd.batch_policy import INF, BatchConfig, Pending
from hostd.batch_tensors import merge_inputs, output_names, split_outputs
from hostd.core.dispatch import Step
from hostd.core.queue import ModelQueue
from hostd.execution import ExecutionGate
from hostd.metrics import HostdMetrics
from hostd.runtimes.base import LoadedModel
from hostd.stats import ModelStats, ewma
from hostd.tensors import DecodedRequest


# A CPU model whose recent batch compute time is under this runs its batches on the event loop thread
# (after INLINE_AFTER batches in worker threads have measured it): ~70 us for an MLP 64-256-8.
INLINE_MAX_S = 0.0005
INLINE_AFTER = 8
# Why not also run a lone batch of a slower model on the loop when the host is idle (it would save the two
# thread wake-ups at concurrency 1): while the loop computes, arriving requests wait inside gRPC unseen, and
# once it is free each reaches the runner alone onto an idle host again, so every batch stays a batch of one.
# The runner cannot tell that from concurrency 1. Tried (ONNX MLP 256-3500-3500-10, 2 cores, lone batches
# under 20 ms inline on an idle host, backing off for 1 s when a request arrived within 1 ms of such a run):
# side by side with the threaded runner, one round at concurrency 32 fell to 86 req/s against 511 and four
# more averaged 481 against 504 with a worse p99, while p50 at concurrency 1 did not improve (10.0-12.6 ms
# against 10.1-11.7). Only a model as cheap as INLINE_MAX_S can afford to block the loop.
# Tried again with wide lone batches (session 26: a batch the core starts wide ran on the loop instead of a
# worker thread, behind a throwaway environment switch given to bench/batching.py --no-triton --rounds 3
# --seconds 4 --variant, same run): concurrency 1 p50
# 4.56 ms against 5.36 (1.27x the plain server's against 1.50x), but concurrency 32 fell to 270 req/s against
# 957, for the reason above. Not kept in that form: a wide lone batch now runs on the loop only right after
# the loop woke from idle, once per wake (ground/loopidle.py), which a backlog in gRPC never lets happen.


def _post(loop: asyncio.AbstractEventLoop, fn: Callable, *args) -> bool:
    """`fn(*args)` on the loop, from a worker thread; False when the loop is closed (hostd is gone: nobody is
    waiting for the answers)."""
    try:
        loop.call_soon_threadsafe(fn, *args)
        return True
    except RuntimeError:
        return False


@dataclass(slots=True)
class _Item:
    arrival: float
    request: DecodedRequest
    future: asyncio.Future
    served: Served | None = None  # told its queue and compute time


@dataclass(frozen=True, slots=True)
class QueueLimits:
    max_queue_size: int
    default_timeout_s: float = 0.0  # 0: no queue timeout
    delay_on_timeout: bool = False


class ModelRunner:
    def __init__(
        self,
        *,
        tenant: str,
        model: str,
        loaded: LoadedModel,
        config: BatchConfig,
        limits: QueueLimits,
        instances: int,
        pool: Executor,
        stats: ModelStats,
        metrics: HostdMetrics,
        gate: ExecutionGate | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_busy: Callable[[bool], None] | None = None,
    ) -> None:
        """`gate`: the host's execution slots shared by all runners (None: only this runner's own executors
        limit it). `on_busy(busy)` is called whenever `busy` changes (the device cache's eviction flag)."""
        self.tenant, self.model = tenant, model
        self._loaded = loaded
        self._limits = limits
        self.queue = ModelQueue(config, instances, limits.max_queue_size)
        self._pool = pool
        self._stats = stats
        self._clock = clock
        self._items: dict[int, _Item] = {}  # queued requests' payloads, by seq
        self._seq = 0
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False
        self._on_busy = on_busy
        self._was_busy = False
        self._idle = asyncio.Event()
        self._idle.set()
        self._inline_depth = 0  # inside an inline batch (its finish may start the next one)
        self._lone_s = 0.0  # recent compute seconds of batches of one request (the wide batches' bound)
        labels = (tenant, model)
        self._m_queue = metrics.queue_duration.labels(*labels)
        self._m_compute = metrics.compute_duration.labels(*labels)
        self._m_batch = metrics.batch_size.labels(*labels)
        self._m_depth = metrics.queue_depth.labels(*labels)
        self._gate = gate or ExecutionGate.unlimited(clock)
        self._gate.add(self)

    # ---- state other parts read -------------------------------------------------------------------
    @property
    def queue_depth(self) -> int:
        return len(self.queue)

    @property
    def instances(self) -> int:
        return self.queue.executors

    @property
    def in_flight(self) -> int:
        return self.queue.inflight

    @property
    def can_run_wide(self) -> bool:
        """The model has a session on every core for a lone batch of one request (hostd/core/dispatch.py)."""
        return self._loaded.wide

    @property
    def busy(self) -> bool:
        """Requests queued or executing: such a model must not be evicted."""
        return self.queue.busy

    def _changed(self) -> None:
        """After the queue or the executors changed: the depth gauge, the idle event, the busy callback."""
        self._m_depth.set(len(self.queue))
        busy = self.queue.busy
        if busy:
            self._idle.clear()
        else:
            self._idle.set()
        if busy != self._was_busy:
            self._was_busy = busy
            # once closed, the model's device memory is the unload's business (a late batch finishing
            # after a drain timeout must not mark a newer load of the same model evictable)
            if self._on_busy is not None and not self._closed:
                self._on_busy(busy)

    # ---- requests ----------------------------------------------------------------------------------
    async def infer(self, req: DecodedRequest, priority: int = 1, deadline: float = INF,
                    served: Served | None = None) -> dict[str, np.ndarray]:
        """The request's outputs; `served` (when given) gets its queue and compute seconds."""
        if self._closed:
            raise Unavailable(f"model {self.model!r} is unloading; retry", reason="unloading", retry_after_ms=100)
        if self.queue.full:
            raise ResourceExhausted(
                f"model {self.model!r}: queue full ({self._limits.max_queue_size} requests waiting)",
                reason="queue_full",
                retry_after_ms=self._retry_hint_ms(),
            )
        now = self._clock()
        self._seq += 1
        seq = self._seq
        timeout_at = now + self._limits.default_timeout_s if self._limits.default_timeout_s > 0 else INF
        # the payload first: a worker that continues may start the request as soon as it is queued
        item = self._items[seq] = _Item(now, req, asyncio.get_running_loop().create_future(), served)
        with self._gate.lock:
            self.queue.add(Pending(
                seq=seq, arrival=now, rows=req.rows, shape_key=req.shape_key, priority=priority,
                deadline=deadline, queue_timeout_at=timeout_at, delay_on_timeout=self._limits.delay_on_timeout,
            ))
        self._changed()
        self._kick()
        try:
            return await item.future
        except asyncio.CancelledError:
            with self._gate.lock:
                removed = self.queue.remove(seq) is not None
            if removed:  # the caller went away: never run it
                self._items.pop(seq, None)
                self._changed()
            raise

    def _retry_hint_ms(self) -> int:
        """A rough time for the queue to drain: mean compute time per batch times batches waiting."""
        s = self._stats.compute_infer
        per_batch = (s.ns / s.count / 1e9) if s.count else 0.01
        batches = max(1, len(self.queue) // max(1, self.queue.config.max_batch_size or 1))
        return max(10, int(1000 * per_batch * batches / max(1, self.queue.executors)))

    # ---- the host core plans (hostd/core/dispatch.py through the gate); the runner executes ----------
    def _kick(self) -> None:
        """Something changed: the core starts what can start (a batch first gets a host execution slot, and
        is formed when the slot is granted, so it can grow meanwhile)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._closed:
            self._gate.kick(self)
        self._changed()

    def _on_timer(self) -> None:
        self._timer = None
        self._kick()

    def apply(self, started: list[tuple[int, ...]], expired: list[int], rejected: list[int],
              wake_at: float | None, now: float, wide: tuple[int, ...] | None = None) -> None:
        """This runner's part of a dispatch step: fail what expired or timed out, start the batches the core
        started (`wide`: the one to run on every core), and plan again at `wake_at`."""
        for seq in expired:
            self._fail(seq, DeadlineExceeded("deadline passed before the request could run", reason="deadline"))
        for seq in rejected:
            self._fail(
                seq,
                Unavailable("request timed out in the model's queue", reason="queue_timeout", retry_after_ms=self._retry_hint_ms()),
            )
        for seqs in started:
            self._start(seqs, now, seqs == wide)
        if wake_at is not None and not self._closed:
            # the earlier of the two: a step a worker took (and posted) may come after a newer kick's, and a
            # plan too early only plans again, one too late would hold a request past its delay
            loop = asyncio.get_running_loop()
            at = loop.time() + max(0.0, wake_at - now)
            if self._timer is None or self._timer.when() > at:
                if self._timer is not None:
                    self._timer.cancel()
                self._timer = loop.call_at(at, self._on_timer)
        self._changed()

    def _start(self, seqs: tuple[int, ...], now: float, wide: bool = False) -> None:
        """The core started this batch (out of the queue, onto an executor): run it in a worker thread, or,
        for a model whose batches take microseconds, right here on the event loop."""
        items = [self._items.pop(s) for s in seqs]
        if self._inline():  # its plan's session, as before, wide or not (MLP 64-256-8 batch 1: 7.2 us, 7.5 wide)
            if self._inline_depth == 0:
                self._execute_inline(items, now)
            else:  # a batch started by an inline batch's finish: next loop turn, not deeper recursion
                asyncio.get_running_loop().call_soon(self._execute_inline, items, now)
            return
        if wide and self._gate.run_here():  # a lone request on an idle host: no thread hop (ground/loopidle.py)
            self._execute_inline(items, now, wide=True)
            return
        self._record_queue(items, now)
        loop = asyncio.get_running_loop()
        try:
            self._pool.submit(self._work, items, loop, wide)
        except RuntimeError as e:  # the pool is shut down: the batch fails, its slot is given back (next turn)
            loop.call_soon(self._finish, items, None, e)

    def _inline(self) -> bool:
        """Run on the event loop thread: a CPU model whose recent batches took under INLINE_MAX_S. A worker
        thread costs such a model two thread wake-ups and two GIL hand-offs per batch (up to the interpreter's
        switch interval each while the loop is busy): on a host saturated by another model, that, not its
        compute, was its latency. Never the first batches (warm-up, unknown cost) nor a GPU model."""
        s = self._stats.compute_infer
        device = getattr(self._loaded, "device", None)  # stand-in models in tests may have none: never inline
        return (device is not None and device.kind == "cpu" and s.count >= INLINE_AFTER
                and self._stats.compute_s_recent < INLINE_MAX_S)

    def _execute_inline(self, items: list[_Item], started: float, wide: bool = False) -> None:
        self._inline_depth += 1
        try:
            self._record_queue(items, started)
            try:
                self._answer(items, *self._run_batch(items, wide))
            except Exception as e:  # noqa: BLE001 - the model failed: every request in the batch gets the error
                self._fail_batch(items, e)
            finally:
                self._gate.finish(self, len(items))
                self._changed()
        finally:
            self._inline_depth -= 1

    def cost_estimate(self, requests: int = 0) -> float:
        """Estimated seconds of device time for a batch: the mean so far (the slots' fair share charges it);
        for one request of a model that can run wide, its recent batches of one request (the dispatch runs
        such a batch wide only when short)."""
        if requests == 1 and self._lone_s and self._loaded.wide:
            return self._lone_s
        s = self._stats.compute_infer
        return (s.ns / s.count / 1e9) if s.count else 0.001

    def _fail(self, seq: int, err: Exception) -> None:
        item = self._items.pop(seq, None)
        if item is not None and not item.future.done():
            item.future.set_exception(err)

    def _record_queue(self, items: list[_Item], started: float) -> None:
        for it in items:
            q = started - it.arrival
            self._stats.record_queue(q)
            self._m_queue.observe(q)
            if it.served is not None:
                it.served.queue_s = q

    def _answer(self, items: list[_Item], results: list[dict[str, np.ndarray]], t_in: int, t_run: int,
                t_out: int) -> None:
        rows = sum(it.request.rows for it in items)
        self._stats.record_batch(rows, t_in, t_run, t_out, len(items))
        if len(items) == 1:
            self._lone_s = ewma(self._lone_s, t_run / 1e9)
        self._m_compute.observe(t_run / 1e9)
        self._m_batch.observe(rows)
        for it, res in zip(items, results, strict=True):
            if it.served is not None:
                it.served.compute_s = t_run / 1e9
            if not it.future.done():
                it.future.set_result(res)

    def _fail_batch(self, items: list[_Item], e: Exception) -> None:
        err = e if isinstance(e, Internal) else Internal(f"model {self.model!r} failed: {type(e).__name__}: {e}")
        for it in items:
            if not it.future.done():
                it.future.set_exception(err)

    def _work(self, items: list[_Item], loop: asyncio.AbstractEventLoop, wide: bool = False) -> None:
        """In a worker thread: run the batch, then hand the outcome to the event loop in one call (no asyncio
        task per batch, no concurrent future chained to an asyncio one: py-spy put that chain on every batch's
        way back to the loop). When the core starts this model's next batch as this one finishes, run it here
        too, before the loop has sent this one's answers: handing it back through the loop and on to a thread
        again costs a wake-up of ~0.6-0.9 ms per 7 ms batch on 2 busy cores (docs/execution.md item 13)."""
        while True:
            try:
                outcome: tuple = (self._run_batch(items, wide), None)
            except Exception as e:  # noqa: BLE001 - the model failed: every request in the batch gets the error
                outcome = (None, e)
            taken = following = None
            if outcome[1] is None and self._gate.continues and not self._closed and not self._inline():
                try:
                    step, now, seqs, wide = self._gate.finish_here(self, len(items))
                    following = [self._items.pop(s) for s in seqs] if seqs is not None else None
                    taken = (step, now, following)
                except Exception as e:  # noqa: BLE001 - a fault in the core: answer the batch; the loop logs it
                    _post(loop, self._answer_then_raise, items, outcome[0], e)
                    return
            if not _post(loop, self._finish, items, *outcome, taken) or following is None:
                return
            items = following

    def _answer_then_raise(self, items: list[_Item], result: tuple, error: Exception) -> None:
        """On the event loop: the batch ran but the core's finish step failed in its worker: the requests get
        their answers, and the error goes to the loop's exception handler (logged), as a failing finish on the
        loop would."""
        try:
            self._answer(items, *result)
        finally:
            raise error

    def _finish(self, items: list[_Item], result: tuple | None, error: Exception | None,
                taken: tuple[Step, float, list[_Item] | None] | None = None) -> None:
        """On the event loop: answer the batch's requests (or fail them), then free its executor and slot; or,
        when its worker already took the core's finish step (`taken`: the step, its time and the batch the
        worker went on to, `_work`), record that batch's queue time and carry out the rest of the step."""
        try:
            if error is not None:
                self._fail_batch(items, error)
            else:
                assert result is not None
                self._answer(items, *result)
        except Exception as e:  # noqa: BLE001 - answering failed: every request in the batch gets the error
            self._fail_batch(items, e)
        finally:
            if taken is None:
                self._gate.finish(self, len(items))  # frees the executor and the slot; starts what can start
            else:
                step, now, following = taken
                if following is not None:
                    self._record_queue(following, now)
                self._gate.apply_finished(step)
            self._changed()

    def _run_batch(self, items: list[_Item], wide: bool = False) -> tuple[list[dict[str, np.ndarray]], int, int, int]:
        """In a worker thread: merge, run once (`wide`: on every core), split back by rows."""
        reqs = [it.request for it in items]
        t0 = time.perf_counter_ns()
        inputs = merge_inputs(reqs)
        t1 = time.perf_counter_ns()
        out = (self._loaded.run_wide if wide else self._loaded.run)(inputs, output_names(reqs))
        t2 = time.perf_counter_ns()
        results = split_outputs(out, reqs, self.model)
        t3 = time.perf_counter_ns()
        return results, t1 - t0, t2 - t1, t3 - t2

    # ---- lifecycle ---------------------------------------------------------------------------------
    async def wait_idle(self) -> None:
        await self._idle.wait()

    def close(self) -> None:
        """Stop taking requests; queued ones get UNAVAILABLE. Callers drain first when they can."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._gate.remove(self)  # withdraws its slot request, if any
        with self._gate.lock:
            cleared = self.queue.clear()
        for seq in cleared:
            self._fail(seq, Unavailable(f"model {self.model!r} was unloaded", reason="unloaded", retry_after_ms=100))
        self._changed()
