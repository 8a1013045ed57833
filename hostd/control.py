"""hostd's internal control service: the host's status as routers and `mmhost top` see it."""

from __future__ import annotations

import time

from hostd.manager import ModelManager
from hostd.memory import MemoryProbe
from protos import hostd_control_pb2 as hc
from protos import hostd_control_pb2_grpc as hc_grpc


def host_status(host_id: str, address: str, manager: ModelManager, probe: MemoryProbe, budget: int,
                started: float, draining: bool, device: str) -> hc.HostStatus:
    models = []
    for (tenant, model, version), e in manager.entries.items():
        r = e.runner
        models.append(
            hc.ModelStatus(
                tenant=tenant, model=model, version=version, state=e.state.value, memory_bytes=e.memory_bytes,
                queue_depth=r.queue_depth if r else 0, in_flight=r.in_flight if r else 0,
                last_used_unix=time.time() - (time.monotonic() - e.last_used) if e.last_used else 0.0,
                reason=e.error,
            )
        )
    used = sum(e.memory_bytes for e in manager.entries.values())
    return hc.HostStatus(
        host_id=host_id, address=address, models=models, device_memory_used=used, device_memory_budget=budget,
        device_memory_total=probe.total(), uptime_s=time.monotonic() - started, draining=draining,
        sent_unix=time.time(), device=device,
    )


class ControlServicer(hc_grpc.HostdControlServicer):
    def __init__(self, status_fn) -> None:
        self._status = status_fn

    async def Status(self, request, context):
        return self._status()
