"""One model version's lifecycle on a host: the ModelState enum with its legal transitions, single-flight
loading (the first caller starts the load, later ones wait on it), FAILED with an exponential backoff
computed from the `now` the caller passes, "no room" back to ABSENT (retry allowed at once), and pinning.

Pure: the shell (hostd/manager.py on asyncio, sim/cluster.py on a virtual clock) asks `want(now)` what a
request should do and reports what happened (`loaded`, `failed`, `no_room`, `begin_unload`, `unloaded`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class ModelState(str, Enum):
    ABSENT = "ABSENT"  # known in the catalog, not in device memory
    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    FAILED = "FAILED"  # the last load failed; retried after a backoff

    @property
    def triton_state(self) -> str:
        """The state string Triton's RepositoryIndex uses."""
        return {"ABSENT": "UNAVAILABLE", "FAILED": "UNAVAILABLE"}.get(self.value, self.value)


LEGAL: dict[ModelState, frozenset[ModelState]] = {
    ModelState.ABSENT: frozenset({ModelState.LOADING}),
    ModelState.LOADING: frozenset({ModelState.READY, ModelState.FAILED, ModelState.ABSENT}),  # ABSENT: no room now
    ModelState.READY: frozenset({ModelState.UNLOADING}),
    ModelState.UNLOADING: frozenset({ModelState.ABSENT}),
    ModelState.FAILED: frozenset({ModelState.LOADING, ModelState.ABSENT}),
}


class IllegalTransition(RuntimeError):
    pass


def check_transition(old: ModelState, new: ModelState) -> None:
    if new not in LEGAL[old]:
        raise IllegalTransition(f"model state cannot go from {old.value} to {new.value}")


def failed_backoff(failures: int, base_s: float = 1.0, cap_s: float = 60.0) -> float:
    """Seconds to wait before retrying a failed load: exponential in consecutive failures, capped."""
    return min(cap_s, base_s * (2 ** max(0, failures - 1)))


class Action(str, Enum):
    """What a request for the model does now (the answer of `Lifecycle.want`)."""

    SERVE = "serve"  # READY: run it
    START_LOAD = "start_load"  # this caller starts the load (the state is LOADING already)
    WAIT_LOAD = "wait_load"  # another caller's load is under way: wait on it
    WAIT_UNLOAD = "wait_unload"  # the model is leaving the device: wait, then ask again
    BACKOFF = "backoff"  # the last load failed and `retry_at` has not passed: answer the error


@dataclass
class Lifecycle:
    backoff_base_s: float = 1.0
    backoff_cap_s: float = 60.0
    state: ModelState = ModelState.ABSENT
    failures: int = 0  # consecutive failed loads
    error: str = ""  # the last load's error, while FAILED
    retry_at: float = 0.0  # while FAILED: no new load before this time
    pinned: bool = False  # never evicted (the device cache holds the same flag per key)

    def _to(self, new: ModelState) -> None:
        check_transition(self.state, new)
        self.state = new

    def want(self, now: float) -> Action:
        """A request wants the model. Single-flight: ABSENT (or FAILED past its backoff) moves to LOADING
        and answers START_LOAD to this caller only; callers after it get WAIT_LOAD."""
        s = self.state
        if s is ModelState.READY:
            return Action.SERVE
        if s is ModelState.LOADING:
            return Action.WAIT_LOAD
        if s is ModelState.UNLOADING:
            return Action.WAIT_UNLOAD
        if s is ModelState.FAILED and now < self.retry_at:
            return Action.BACKOFF
        self._to(ModelState.LOADING)
        return Action.START_LOAD

    def loaded(self) -> None:
        self._to(ModelState.READY)
        self.failures = 0
        self.error = ""

    def failed(self, error: str, now: float) -> float:
        """The load failed: FAILED until `retry_at` (returned), backoff base * 2^(failures-1), capped."""
        self.failures += 1
        self.error = error
        self.retry_at = now + failed_backoff(self.failures, self.backoff_base_s, self.backoff_cap_s)
        self._to(ModelState.FAILED)
        return self.retry_at

    def no_room(self) -> None:
        """The device had no room: nothing is wrong with the model, so back to ABSENT (retry at once)."""
        self._to(ModelState.ABSENT)

    def retry_now(self) -> None:
        """An explicit load skips the remaining backoff."""
        self.retry_at = 0.0

    def begin_unload(self) -> bool:
        """Leave the device. READY -> UNLOADING (True: the caller drains and frees it, then `unloaded`);
        FAILED -> ABSENT (forget the failure); other states: nothing to do (False)."""
        if self.state is ModelState.READY:
            self._to(ModelState.UNLOADING)
            return True
        if self.state is ModelState.FAILED:
            self._to(ModelState.ABSENT)
        return False

    def unloaded(self) -> None:
        self._to(ModelState.ABSENT)
