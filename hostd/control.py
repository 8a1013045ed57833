"""hostd's internal control service: the host's status as routers, heartbeats and `mmhost top` see it."""

from __future__ import annotations

import time
from dataclasses import dataclass

from hostd.execution import ExecutionGate
from hostd.manager import ModelManager
from hostd.memory import MemoryProbe
from protos import hostd_control_pb2 as hc
from protos import hostd_control_pb2_grpc as hc_grpc


@dataclass
class HostCounters:
    """Host-wide counters the servicer keeps (by tenant) and the device-tier hit counts."""

    requests_by_tenant: dict[str, int]
    shed_by_tenant: dict[str, int]
    cache_hits: int = 0
    cache_misses: int = 0


def host_status(host_id: str, address: str, manager: ModelManager, probe: MemoryProbe, budget: int,
                started: float, draining: bool, device: str, counters: HostCounters | None = None,
                gate: ExecutionGate | None = None, group: str = "", data_port: int = 0) -> hc.HostStatus:
    now_mono, now_unix = time.monotonic(), time.time()
    models = []
    for (tenant, model, version), e in manager.entries.items():
        r, st = e.runner, e.stats
        models.append(
            hc.ModelStatus(
                tenant=tenant, model=model, version=version, state=e.state.value, memory_bytes=e.memory_bytes,
                queue_depth=r.queue_depth if r else 0, in_flight=r.in_flight if r else 0,
                last_used_unix=now_unix - (now_mono - e.last_used) if e.last_used else 0.0,
                requests_per_s=st.rate.value(now_mono), reason=e.error,
                queue_ms_recent=st.queue_s_recent * 1000, compute_ms_recent=st.compute_s_recent * 1000,
                requests_total=st.success.count + st.fail.count, shed_total=st.shed,
                instances=r.instances if r else 0, pinned=e.pinned,
            )
        )
    c = counters or HostCounters({}, {})
    return hc.HostStatus(
        host_id=host_id, address=address, models=models, device_memory_used=manager.cache.used,
        device_memory_budget=budget, device_memory_total=probe.total(), uptime_s=now_mono - started,
        draining=draining, sent_unix=now_unix, device=device, cache_hits=c.cache_hits, cache_misses=c.cache_misses,
        requests_total=sum(c.requests_by_tenant.values()), shed_by_tenant=c.shed_by_tenant,
        requests_by_tenant=c.requests_by_tenant,
        execution_slots=gate.slots if gate else 0, slots_busy=(gate.slots - gate.free) if gate else 0,
        slots_waiting=gate.waiting if gate else 0, host_group=group, data_port=data_port,
    )


class ControlServicer(hc_grpc.HostdControlServicer):
    def __init__(self, status_fn) -> None:
        self._status = status_fn

    async def Status(self, request, context):
        return self._status()
