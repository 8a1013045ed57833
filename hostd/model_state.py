"""A model version's lifecycle on one host, as an enum with legal transitions (never a `ready` bool)."""

from __future__ import annotations

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
