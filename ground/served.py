"""What served one inference request, as a hostd tells its router in the `mmhost-served` trailer
(ground/wire.py) and the router writes to its access log (router/accesslog.py):

    mmhost-served: v=1;b=5300000;l=0.000;q=0.120;c=1.300

v: the model version that served (or refused) it; b: the version's stored size in bytes (its manifest's
files); l, q, c: milliseconds the request waited for the model to load, waited in the model's queue, and
spent computing (its batch's run). One key, short numbers: it rides on every answer. Version names never
hold ';' or '=' (ground/manifest.py's alphabet).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Served:
    version: str = ""
    size_bytes: int = 0
    load_s: float = 0.0
    queue_s: float = 0.0
    compute_s: float = 0.0

    def encode(self) -> str:
        return (f"v={self.version};b={self.size_bytes};l={self.load_s * 1e3:.3f};q={self.queue_s * 1e3:.3f};"
                f"c={self.compute_s * 1e3:.3f}")

    @classmethod
    def decode(cls, value: str | bytes | None) -> Served | None:
        """None for a missing or malformed value (an older hostd, or something in between)."""
        if not value:
            return None
        if isinstance(value, bytes):
            value = value.decode("ascii", "replace")
        try:
            f = dict(part.split("=", 1) for part in value.split(";"))
            return cls(f["v"], int(f["b"]), float(f["l"]) / 1e3, float(f["q"]) / 1e3, float(f["c"]) / 1e3)
        except (KeyError, ValueError):
            return None
