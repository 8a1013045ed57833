"""Per-model-version statistics in Triton's ModelStatistics shape: counts and times split into queue and
compute, and per-batch-size execution stats."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from protos import grpc_service_pb2 as pb


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns


@dataclass
class BatchStat:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


@dataclass
class DecayingRate:
    """Events per second, exponentially decayed with time constant `tau_s` (no clock inside: pass now)."""

    tau_s: float = 10.0
    value_at: float = 0.0
    last: float = 0.0

    def hit(self, now: float, n: int = 1) -> None:
        self.value_at = self.value(now) + n / self.tau_s
        self.last = now

    def value(self, now: float) -> float:
        return self.value_at * math.exp(-max(0.0, now - self.last) / self.tau_s) if self.last else 0.0


def ewma(old: float, new: float, alpha: float = 0.2) -> float:
    return new if old == 0.0 else old + alpha * (new - old)


@dataclass
class ModelStats:
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0
    batches: dict[int, BatchStat] = field(default_factory=dict)
    queue_s_recent: float = 0.0
    compute_s_recent: float = 0.0
    shed: int = 0
    rate: DecayingRate = field(default_factory=DecayingRate)

    def record_queue(self, seconds: float) -> None:
        self.queue.add(int(seconds * 1e9))
        self.queue_s_recent = ewma(self.queue_s_recent, seconds)

    def record_batch(self, rows: int, input_ns: int, infer_ns: int, output_ns: int, requests: int) -> None:
        self.execution_count += 1
        self.inference_count += rows
        self.compute_s_recent = ewma(self.compute_s_recent, infer_ns / 1e9)
        b = self.batches.setdefault(rows, BatchStat())
        b.compute_input.add(input_ns)
        b.compute_infer.add(infer_ns)
        b.compute_output.add(output_ns)
        self.compute_input.add(input_ns, requests)
        self.compute_infer.add(infer_ns, requests)
        self.compute_output.add(output_ns, requests)

    def to_proto(self, name: str, version: str) -> pb.ModelStatistics:
        def d(x: Duration) -> pb.StatisticDuration:
            return pb.StatisticDuration(count=x.count, ns=x.ns)

        return pb.ModelStatistics(
            name=name,
            version=version,
            last_inference=self.last_inference_ms,
            inference_count=self.inference_count,
            execution_count=self.execution_count,
            inference_stats=pb.InferStatistics(
                success=d(self.success),
                fail=d(self.fail),
                queue=d(self.queue),
                compute_input=d(self.compute_input),
                compute_infer=d(self.compute_infer),
                compute_output=d(self.compute_output),
            ),
            batch_stats=[
                pb.InferBatchStatistics(
                    batch_size=size,
                    compute_input=d(b.compute_input),
                    compute_infer=d(b.compute_infer),
                    compute_output=d(b.compute_output),
                )
                for size, b in sorted(self.batches.items())
            ],
        )
