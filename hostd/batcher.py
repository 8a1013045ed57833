"""The per-model dynamic batcher: an asyncio runner around the pure batch policy.

Requests wait in the model's queue; whenever something changes (a request arrives, an executor frees up,
a timer fires) the runner asks `batch_policy.decide` what to do and does it. Executors are `instances`
concurrent runs of the model in worker threads (ONNX Runtime and torch release the GIL while computing).
Stacking inputs, the forward pass and splitting outputs all happen in the worker thread, off the event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np

from hostd.batch_policy import INF, BatchConfig, Pending, decide
from ground.errors import DeadlineExceeded, Internal, ResourceExhausted, Unavailable
from hostd.execution import ExecutionGate
from hostd.metrics import HostdMetrics
from hostd.runtimes.base import LoadedModel
from hostd.stats import ModelStats
from hostd.tensors import DecodedRequest


@dataclass(slots=True)
class _Item:
    pending: Pending
    request: DecodedRequest
    future: asyncio.Future


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
    ) -> None:
        self.tenant, self.model = tenant, model
        self._loaded = loaded
        self._cfg = config
        self._limits = limits
        self._free = instances
        self._instances = instances
        self._pool = pool
        self._stats = stats
        self._clock = clock
        self._queue: dict[int, _Item] = {}
        self._seq = 0
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task] = set()
        self._closed = False
        self._gate = gate
        self._asking: int | None = None  # the gate request in flight: 0 while asking, then its seq
        self._idle = asyncio.Event()
        self._idle.set()
        labels = (tenant, model)
        self._m_queue = metrics.queue_duration.labels(*labels)
        self._m_compute = metrics.compute_duration.labels(*labels)
        self._m_batch = metrics.batch_size.labels(*labels)
        self._m_depth = metrics.queue_depth.labels(*labels)

    # ---- state other parts read -------------------------------------------------------------------
    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    @property
    def instances(self) -> int:
        return self._instances

    @property
    def in_flight(self) -> int:
        return self._instances - self._free

    @property
    def busy(self) -> bool:
        """Requests queued or executing: such a model must not be evicted."""
        return bool(self._queue) or self._free < self._instances

    # ---- requests ----------------------------------------------------------------------------------
    async def infer(self, req: DecodedRequest, priority: int = 1, deadline: float = INF) -> dict[str, np.ndarray]:
        if self._closed:
            raise Unavailable(f"model {self.model!r} is unloading; retry", reason="unloading", retry_after_ms=100)
        if len(self._queue) >= self._limits.max_queue_size:
            raise ResourceExhausted(
                f"model {self.model!r}: queue full ({self._limits.max_queue_size} requests waiting)",
                reason="queue_full",
                retry_after_ms=self._retry_hint_ms(),
            )
        now = self._clock()
        self._seq += 1
        timeout_at = now + self._limits.default_timeout_s if self._limits.default_timeout_s > 0 else INF
        item = _Item(
            Pending(
                seq=self._seq,
                arrival=now,
                rows=req.rows,
                shape_key=req.shape_key,
                priority=priority,
                deadline=deadline,
                queue_timeout_at=timeout_at,
                delay_on_timeout=self._limits.delay_on_timeout,
            ),
            req,
            asyncio.get_running_loop().create_future(),
        )
        self._queue[item.pending.seq] = item
        self._idle.clear()
        self._m_depth.set(len(self._queue))
        self._kick()
        try:
            return await item.future
        except asyncio.CancelledError:
            self._queue.pop(item.pending.seq, None)  # the caller went away: never run it
            self._maybe_idle()
            raise

    def _retry_hint_ms(self) -> int:
        """A rough time for the queue to drain: mean compute time per batch times batches waiting."""
        s = self._stats.compute_infer
        per_batch = (s.ns / s.count / 1e9) if s.count else 0.01
        batches = max(1, len(self._queue) // max(1, self._cfg.max_batch_size or 1))
        return max(10, int(1000 * per_batch * batches / max(1, self._instances)))

    # ---- the loop around the policy ----------------------------------------------------------------
    def _decide(self, now: float):
        d = decide([it.pending for it in self._queue.values()], now, self._free, self._cfg)
        for seq in d.expired:
            self._fail(seq, DeadlineExceeded("deadline passed before the request could run", reason="deadline"))
        for seq in d.rejected:
            self._fail(
                seq,
                Unavailable("request timed out in the model's queue", reason="queue_timeout", retry_after_ms=self._retry_hint_ms()),
            )
        return d

    def _kick(self) -> None:
        """Something changed: run what the policy says can run. With a host execution gate, a batch that
        could run first waits for a slot, and is formed when the slot is granted (so it can grow meanwhile)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._queue and self._free > 0 and self._asking is None:
            now = self._clock()
            d = self._decide(now)
            if not d.run:
                if d.wake_at is not None:
                    self._timer = asyncio.get_running_loop().call_later(max(0.0, d.wake_at - now), self._kick)
                break
            if self._gate is None:
                self._start(d.run, now)
                continue
            head = self._queue[d.run[0]].pending
            self._asking = 0
            seq = self._gate.request(self.tenant, head.priority, self._cost_estimate(), self._granted)
            if self._asking == 0:  # not granted yet: remember the request so close() can cancel it
                self._asking = seq
            break
        self._m_depth.set(len(self._queue))
        self._maybe_idle()

    def _granted(self) -> None:
        assert self._gate is not None
        self._asking = None
        now = self._clock()
        d = self._decide(now) if (self._queue and not self._closed and self._free > 0) else None
        if d is None or not d.run:
            self._gate.release()  # nothing to run after all (expired, cancelled, or waiting to fill)
        else:
            self._start(d.run, now)
        asyncio.get_running_loop().call_soon(self._kick)

    def _start(self, seqs: tuple[int, ...], now: float) -> None:
        items = [self._queue.pop(s) for s in seqs]
        self._free -= 1
        task = asyncio.get_running_loop().create_task(self._execute(items, now))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _cost_estimate(self) -> float:
        s = self._stats.compute_infer
        return (s.ns / s.count / 1e9) if s.count else 0.001

    def _fail(self, seq: int, err: Exception) -> None:
        item = self._queue.pop(seq, None)
        if item is not None and not item.future.done():
            item.future.set_exception(err)

    def _maybe_idle(self) -> None:
        if not self._queue and self._free == self._instances:
            self._idle.set()

    async def _execute(self, items: list[_Item], started: float) -> None:
        for it in items:
            q = started - it.pending.arrival
            self._stats.record_queue(q)
            self._m_queue.observe(q)
        try:
            loop = asyncio.get_running_loop()
            results, t_in, t_run, t_out = await loop.run_in_executor(self._pool, self._run_batch, items)
            rows = sum(it.request.rows for it in items)
            self._stats.record_batch(rows, t_in, t_run, t_out, len(items))
            self._m_compute.observe(t_run / 1e9)
            self._m_batch.observe(rows)
            for it, res in zip(items, results):
                if not it.future.done():
                    it.future.set_result(res)
        except Exception as e:  # noqa: BLE001 - the model failed: every request in the batch gets the error
            err = e if isinstance(e, Internal) else Internal(f"model {self.model!r} failed: {type(e).__name__}: {e}")
            for it in items:
                if not it.future.done():
                    it.future.set_exception(err)
        finally:
            self._free += 1
            if self._gate is not None:
                self._gate.release()
            if not self._closed:
                self._kick()
            self._maybe_idle()

    def _run_batch(self, items: list[_Item]) -> tuple[list[dict[str, np.ndarray]], int, int, int]:
        """In a worker thread: stack, run once, split back by rows."""
        t0 = time.perf_counter_ns()
        names: list[str] = []
        for it in items:
            for n in it.request.outputs:
                if n not in names:
                    names.append(n)
        if len(items) == 1:
            inputs = items[0].request.inputs
        else:
            inputs = {k: np.concatenate([it.request.inputs[k] for it in items]) for k in items[0].request.inputs}
        t1 = time.perf_counter_ns()
        out = self._loaded.run(inputs, names)
        t2 = time.perf_counter_ns()
        if len(items) == 1:
            results = [{n: out[n] for n in items[0].request.outputs}]
        else:
            total = sum(it.request.rows for it in items)
            for n in names:
                if out[n].ndim == 0 or out[n].shape[0] != total:
                    raise Internal(
                        f"model {self.model!r}: output {n!r} has shape {list(out[n].shape)}, expected {total} rows; "
                        "the model cannot be batched (set max_batch_size 0 in its manifest)"
                    )
            results = []
            off = 0
            for it in items:
                r = it.request.rows
                results.append({n: out[n][off : off + r] for n in it.request.outputs})
                off += r
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
        if self._gate is not None and self._asking:
            self._gate.cancel(self._asking)
            self._asking = None
        for seq in list(self._queue):
            self._fail(seq, Unavailable(f"model {self.model!r} was unloaded", reason="unloaded", retry_after_ms=100))
        self._m_depth.set(0)
