"""One model's queue on a host: its pending requests and its executors (concurrent runs of the model),
over the pure batch policy (hostd.batch_policy.decide).

Payload-agnostic: items are `Pending` records keyed by seq; the shell keeps the tensors and futures (hostd)
or arrival times (sim). The cycle is plan -> execute -> commit:
- `plan(now)` asks the policy. Expired and rejected requests leave the queue at once (the shell answers
  them); `run` names a batch that may start now, still queued until `start(run)` (a shell that waits for a
  host execution slot plans again when the slot is granted, so the batch can grow meanwhile).
- `start(seqs)` takes the batch out of the queue onto a free executor; `finish(n)` frees the executor.
"""

from __future__ import annotations

from hostd.batch_policy import BatchConfig, BatchDecision, Pending, decide


class ModelQueue:
    def __init__(self, config: BatchConfig, executors: int = 1, max_size: int = 1 << 62) -> None:
        self.config = config
        self.executors = executors
        self.free = executors  # idle executors
        self.max_size = max_size
        self.pending: dict[int, Pending] = {}
        self.inflight = 0  # batches running
        self.running = 0  # requests in those batches

    def __len__(self) -> int:
        return len(self.pending)

    @property
    def full(self) -> bool:
        return len(self.pending) >= self.max_size

    @property
    def busy(self) -> bool:
        """Requests queued or running: such a model must not be evicted."""
        return bool(self.pending) or self.inflight > 0

    def add(self, p: Pending) -> None:
        self.pending[p.seq] = p

    def remove(self, seq: int) -> Pending | None:
        """The caller went away: the request never runs."""
        return self.pending.pop(seq, None)

    def plan(self, now: float) -> BatchDecision:
        d = decide(list(self.pending.values()), now, self.free, self.config)
        for seq in d.expired:
            del self.pending[seq]
        for seq in d.rejected:
            del self.pending[seq]
        return d

    def start(self, seqs: tuple[int, ...]) -> list[Pending]:
        """Commit a planned batch: out of the queue, onto an executor."""
        batch = [self.pending.pop(s) for s in seqs]
        self.free -= 1
        self.inflight += 1
        self.running += len(batch)
        return batch

    def finish(self, requests: int) -> None:
        """A batch of `requests` finished (answered or failed): its executor is free again."""
        self.free += 1
        self.inflight -= 1
        self.running -= requests

    def clear(self) -> list[int]:
        """Drop every queued request (the model is unloading); returns their seqs."""
        seqs = list(self.pending)
        self.pending.clear()
        return seqs
