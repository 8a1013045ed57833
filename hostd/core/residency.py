"""Which model versions a host holds and in what state: each version's Lifecycle (core/lifecycle.py)
together with the device cache (core/device.py), so that a transition and its bytes change in one call
(a load that finds no room is ABSENT and counted nowhere; an unloading model is busy, so no other plan
picks it; a failed load frees what it reserved).

Pure: hostd/manager.py (asyncio) and sim/cluster.py (virtual clock) drive it; pass `now`.
"""

from __future__ import annotations

from collections.abc import Hashable

from hostd.cache.policy import EvictionPlan, Resident
from hostd.core.device import DeviceCache
from hostd.core.lifecycle import Action, Lifecycle


class Residency:
    def __init__(self, cache: DeviceCache, backoff_base_s: float = 1.0, backoff_cap_s: float = 60.0) -> None:
        self.cache = cache
        self.backoff_base_s = backoff_base_s
        self.backoff_cap_s = backoff_cap_s
        self.lives: dict[Hashable, Lifecycle] = {}

    def life(self, key: Hashable) -> Lifecycle:
        """The version's lifecycle (ABSENT the first time it is asked for)."""
        life = self.lives.get(key)
        if life is None:
            life = self.lives[key] = Lifecycle(self.backoff_base_s, self.backoff_cap_s)
        return life

    def want(self, key: Hashable, now: float) -> Action:
        """A request wants the model (see Lifecycle.want); a SERVE counts as a use of the cached model."""
        action = self.life(key).want(now)
        if action is Action.SERVE:
            self.cache.access(key, now)
        return action

    def reserve(self, key: Hashable, tenant: str, size: int, now: float) -> EvictionPlan:
        """After START_LOAD: room for `size` bytes. The plan names models to unload first; a refused plan
        leaves the model ABSENT (nothing wrong with it: a later request may try again at once)."""
        life = self.life(key)
        plan = self.cache.reserve(key, tenant, size, now, pinned=life.pinned)
        if not plan.ok:
            life.no_room()
        return plan

    def loaded(self, key: Hashable, size: int, load_cost: float, now: float) -> None:
        self.life(key).loaded()
        self.cache.loaded(key, size, load_cost, now)

    def no_room(self, key: Hashable) -> None:
        """A load that had its reservation found no room after all: freed, back to ABSENT."""
        self.cache.release(key)
        self.life(key).no_room()

    def failed(self, key: Hashable, error: str, now: float) -> float:
        """The load failed: its reservation is freed; FAILED until the returned time."""
        self.cache.release(key)
        return self.life(key).failed(error, now)

    def begin_unload(self, key: Hashable) -> bool:
        """True: READY -> UNLOADING (busy from now on; call `unloaded` when it is gone). FAILED -> ABSENT."""
        if self.life(key).begin_unload():
            self.cache.set_busy(key, True)
            return True
        return False

    def unloaded(self, key: Hashable) -> Resident | None:
        """The model left the device; returns its cache record."""
        r = self.cache.release(key)
        self.life(key).unloaded()
        return r

    def pin(self, key: Hashable, pinned: bool) -> None:
        self.life(key).pinned = pinned
        self.cache.set_pinned(key, pinned)
