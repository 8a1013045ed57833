"""What this router itself just did, which the periodically refreshed view cannot show yet: requests in
flight per model and host, loads it started (so a burst of first requests all go to the one host that is
loading), and each model's request rate. Times are monotonic seconds passed in by the caller."""

from __future__ import annotations

from collections.abc import Mapping

_EMPTY: dict = {}


class LocalLoad:
    def __init__(self, rate_window_s: float = 1.0) -> None:
        self.inflight: dict[str, dict[str, int]] = {}
        self.pending: dict[str, dict[str, float]] = {}
        self._window = rate_window_s
        self._rates: dict[str, list[float]] = {}  # key -> [window start, count this window, rate of last]

    def begin(self, key: str, host: str) -> None:
        d = self.inflight.setdefault(key, {})
        d[host] = d.get(host, 0) + 1

    def end(self, key: str, host: str) -> None:
        d = self.inflight.get(key)
        if d is None:
            return
        n = d.get(host, 0) - 1
        if n > 0:
            d[host] = n
        else:
            d.pop(host, None)
            if not d:
                del self.inflight[key]

    def inflight_for(self, key: str) -> Mapping[str, int]:
        return self.inflight.get(key, _EMPTY)

    def started_load(self, key: str, host: str, now: float) -> None:
        self.pending.setdefault(key, {})[host] = now

    def forget_load(self, key: str, host: str) -> None:
        d = self.pending.get(key)
        if d is not None:
            d.pop(host, None)
            if not d:
                del self.pending[key]

    def pending_for(self, key: str) -> Mapping[str, float]:
        return self.pending.get(key, _EMPTY)

    def hit(self, key: str, now: float) -> float:
        """Count a request; the model's rate over the last full window (requests/s)."""
        r = self._rates.get(key)
        if r is None:
            r = self._rates[key] = [now, 0.0, 0.0]
        if now - r[0] >= self._window:
            r[2] = r[1] / (now - r[0]) if now - r[0] < 2 * self._window else 0.0
            r[0], r[1] = now, 0.0
        r[1] += 1
        return r[2]

    def sweep(self, now: float, pending_ttl_s: float) -> None:
        """Forget expired loads and idle rates (keeps memory flat in the number of models)."""
        for key in list(self.pending):
            d = self.pending[key]
            for host in [h for h, t in d.items() if now - t >= pending_ttl_s]:
                del d[host]
            if not d:
                del self.pending[key]
        for key in [k for k, r in self._rates.items() if now - r[0] >= 10 * self._window]:
            del self._rates[key]
