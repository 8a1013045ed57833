"""ModelStatistics across hosts: each host answers for the copies it holds; the router adds them up per
(model, version). Pure: response messages in, one response out."""

from __future__ import annotations

from collections.abc import Iterable

from protos import grpc_service_pb2 as pb


def _add_durations(dst, src) -> None:
    for f in dst.DESCRIPTOR.fields:
        if f.message_type is not None and f.message_type.name == "StatisticDuration":
            d, s = getattr(dst, f.name), getattr(src, f.name)
            d.count += s.count
            d.ns += s.ns


def add_stats(dst: pb.ModelStatistics, src: pb.ModelStatistics) -> None:
    """Add one host's statistics of a model version into `dst`."""
    dst.last_inference = max(dst.last_inference, src.last_inference)
    dst.inference_count += src.inference_count
    dst.execution_count += src.execution_count
    _add_durations(dst.inference_stats, src.inference_stats)
    by_size = {b.batch_size: b for b in dst.batch_stats}
    for b in src.batch_stats:
        if b.batch_size in by_size:
            _add_durations(by_size[b.batch_size], b)
        else:
            dst.batch_stats.add().CopyFrom(b)


def merge_statistics(responses: Iterable[pb.ModelStatisticsResponse], name: str = "",
                     version: str = "") -> pb.ModelStatisticsResponse:
    """The hosts' responses added up, sorted by (model, version). A host that never ran a model lists only
    its name and is left out; a named model no host has run is answered with zeros."""
    merged: dict[tuple[str, str], pb.ModelStatistics] = {}
    for r in responses:
        for s in r.model_stats:
            if not s.version and not s.inference_count and not s.execution_count:
                continue
            k = (s.name, s.version)
            if k in merged:
                add_stats(merged[k], s)
            else:
                merged[k] = s
    if name and not merged:
        merged[(name, version)] = pb.ModelStatistics(name=name, version=version)
    return pb.ModelStatisticsResponse(model_stats=[merged[k] for k in sorted(merged)])
