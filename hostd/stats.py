"""Per-model-version statistics in Triton's ModelStatistics shape: counts and times split into queue and
compute, and per-batch-size execution stats."""

from __future__ import annotations

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

    def record_batch(self, rows: int, input_ns: int, infer_ns: int, output_ns: int, requests: int) -> None:
        self.execution_count += 1
        self.inference_count += rows
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
