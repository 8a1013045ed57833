"""Getting one call to a host that answers it: place (router/placement_policy.py), forward, and on failure try
another host within the attempt limit, the retry budget and the deadline; start another copy of a hot model;
mark a host down when router/failover.py says the failure was the host's.

Everything it touches comes in: the host connection (a HostClient: gRPC in serving, a fake host in the unit
tests), the clock (a callable returning monotonic seconds), the random source. It never reads
`time.monotonic` itself, so failover, retries and deadlines are tested without processes or sleeping.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Mapping, Sequence

from ground.deadlines import INF, remaining_s
from ground.errors import DeadlineExceeded, ServingError, Unavailable
from ground.wire import TENANT_HEADER, Reason
from protos import grpc_service_pb2 as pb
from router.cluster import ClusterView, model_key
from router.failover import Outcome, RetryBudget, classify
from router.host_groups import group_of, in_group
from router.host_client import HostClient, HostError
from router.local_load import LocalLoad
from router.metrics import RouterMetrics
from router.placement_policy import HostView, PlacementConfig, PlacementDecision, place
from router.placement_policy import Reason as PlaceReason

log = logging.getLogger(__name__)

Clock = Callable[[], float]
REPLICATE_TIMEOUT_S = 300.0


class Dispatcher:
    def __init__(self, *, hosts: HostClient, cluster: ClusterView, local: LocalLoad, metrics: RouterMetrics,
                 clock: Clock, max_attempts: int, budget: RetryBudget, placement: PlacementConfig,
                 rng: random.Random, groups: Mapping[str, str] | None = None) -> None:
        """`groups`: RouterSettings.host_groups (router/host_groups.py): which hosts each model may go to."""
        self.hosts, self.cluster, self.local, self.metrics = hosts, cluster, local, metrics
        self.clock = clock
        self.max_attempts = max_attempts
        self.budget = budget
        self.pcfg = placement
        self.rng = rng
        self.background: set[asyncio.Task] = set()  # copies of hot models being loaded
        self.groups: Mapping[str, str] = dict(groups or {})
        self._empty_groups: set[str] = set()  # groups with no host up, logged once until one comes

    def hosts_for(self, tenant: str, model: str) -> list[HostView]:
        """The up hosts this tenant's model may be placed on: those of its host group."""
        group = group_of(self.groups, tenant, model)
        hosts = in_group(self.cluster.eligible(), group)
        if not hosts and self.cluster.eligible():
            if group not in self._empty_groups:
                self._empty_groups.add(group)
                log.warning("no host of group %r is up (models mapped to it get UNAVAILABLE no_host); %d other "
                            "host(s) are", group or "(shared)", len(self.cluster.eligible()))
        elif group in self._empty_groups:
            self._empty_groups.discard(group)
        return hosts

    def _place(self, key: str, tenant: str, model: str, excluded: set[str], now: float) -> PlacementDecision:
        hosts = [h for h in self.hosts_for(tenant, model) if h.address not in excluded]
        return place(key, hosts, now, local_inflight=self.local.inflight_for(key), pending=self.local.pending_for(key),
                     rate=self.local.hit(key, now), size_bytes=self.cluster.size_of(key),
                     draws=(self.rng.random(), self.rng.random()), cfg=self.pcfg)

    async def forward(self, tenant: str, model: str, version: str, method: str, body: bytes, *,
                      deadline: float = INF, loads: bool = True, trailers: list | None = None) -> tuple[bytes, str]:
        """Place and forward `body` unchanged, retrying on another host. Returns (response bytes, host).
        `deadline`: absolute, on this dispatcher's clock (INF for none); each attempt gets what is left of
        it as its timeout. `loads`: this call makes the host load the model. `trailers`: gets the answering
        host's trailing metadata. Raises Forwarded (a host's status, passed on, with the host's address),
        Unavailable (no host) or DeadlineExceeded."""
        key = model_key(tenant, model, version)
        md = ((TENANT_HEADER, tenant),)
        excluded: set[str] = set()
        self.budget.deposit()
        last: ServingError | None = None
        for attempt in range(1, self.max_attempts + 1):
            now = self.clock()
            p = self._place(key, tenant, model, excluded, now)
            if p.host is None:
                raise last or Unavailable("no host is available", retry_after_ms=500, reason=Reason.NO_HOST.value)
            self.metrics.placements.labels(p.reason.value).inc()
            if loads and p.reason is PlaceReason.LOAD:
                self.local.started_load(key, p.host, now)
            if p.replicate_to is not None:
                self._replicate(tenant, model, version, key, p.replicate_to, now)
            timeout = remaining_s(deadline, now)
            if timeout is not None and timeout <= 0:
                raise DeadlineExceeded("deadline exceeded before the request could be forwarded",
                                       reason=Reason.DEADLINE.value)
            self.local.begin(key, p.host)
            try:
                return await self.hosts.unary(p.host, method, body, timeout=timeout, metadata=md,
                                              trailers=trailers, lane=key), p.host
            except HostError as e:
                outcome = classify(e.code, e.trailing)
                err = e.forwarded(p.host)
                if outcome is Outcome.HOST_DOWN:
                    self._host_down(key, p.host, e)
                if outcome is Outcome.FINAL or attempt == self.max_attempts:
                    raise err from None
                if not self.budget.withdraw():
                    self.metrics.retry_budget_exhausted.inc()
                    raise err from None
                self.metrics.retries.labels(outcome.value).inc()
                excluded.add(p.host)
                last = err
            finally:
                self.local.end(key, p.host)
        raise last or Unavailable("no host is available", retry_after_ms=500)  # unreachable: the loop raises

    def replicate_if_hot(self, tenant: str, model: str, now: float) -> str | None:
        """For calls that never pass through `forward` (the fast lane, router/fastlane.py): the same placement
        rule, asked once per refresh, starts another copy of a hot model (every READY copy has hot_queue_depth
        requests outstanding in the hosts' view) where `forward` would. Returns the host it loads on, or None.
        Records no request (the model's local rate is the Python lane's alone)."""
        key = model_key(tenant, model)
        p = place(key, self.hosts_for(tenant, model), now, local_inflight=self.local.inflight_for(key),
                  pending=self.local.pending_for(key), size_bytes=self.cluster.size_of(key),
                  draws=(self.rng.random(), self.rng.random()), cfg=self.pcfg)
        if p.replicate_to is None:
            return None
        self._replicate(tenant, model, "", key, p.replicate_to, now)
        return p.replicate_to

    def _host_down(self, key: str, host: str, e: HostError) -> None:
        self.local.forget_load(key, host)
        if self.cluster.mark_down(host):
            self.metrics.hosts_marked_down.inc()
            self.metrics.hosts_up.set(len(self.cluster.eligible()))
            log.warning("host %s marked down: %s %s", host, e.code.name, e.details)

    def _replicate(self, tenant: str, model: str, version: str, key: str, host: str, now: float) -> None:
        """Start loading another copy of a hot model, without making any request wait for it."""
        self.local.started_load(key, host, now)
        self.metrics.replications.inc()
        req = pb.RepositoryModelLoadRequest(model_name=model)
        if version:
            req.parameters["version"].string_param = version

        async def run() -> None:
            try:
                await self.hosts.unary(host, "RepositoryModelLoad", req.SerializeToString(),
                                       timeout=REPLICATE_TIMEOUT_S, metadata=((TENANT_HEADER, tenant),))
            except HostError as e:
                self.local.forget_load(key, host)
                log.info("extra copy of %s on %s failed: %s %s", key, host, e.code.name, e.details)

        t = asyncio.get_running_loop().create_task(run())
        self.background.add(t)
        t.add_done_callback(self.background.discard)

    async def stop(self) -> None:
        """Cancel the loads of extra copies still under way (on shutdown)."""
        tasks = list(self.background)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def broadcast(self, tenant: str, addresses: Sequence[str], method: str, body: bytes, *,
                        timeout: float | None) -> list[bytes | HostError]:
        """The same call to every host in `addresses`, concurrently: each one's response or HostError, in
        order. No placement, no retries, nothing marked down."""
        md = ((TENANT_HEADER, tenant),)
        results = await asyncio.gather(*(self.hosts.unary(a, method, body, timeout=timeout, metadata=md)
                                         for a in addresses), return_exceptions=True)
        out: list[bytes | HostError] = []
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, HostError):
                raise r
            out.append(r)
        return out
