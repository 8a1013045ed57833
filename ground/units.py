"""Byte sizes from the command line: '512MiB', '8GB', '1234', or a fraction of a total ('0.8', '80%')."""

from __future__ import annotations

import re

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z%]*)\s*$")


def parse_bytes(text: str | int, total: int | None = None) -> int:
    """Absolute sizes need a unit or an integer; '0.8' or '80%' is a fraction of `total`."""
    if isinstance(text, int):
        return text
    m = _RE.match(text)
    if not m:
        raise ValueError(f"cannot read a byte size from {text!r} (e.g. 512MiB, 8GB, 0.8, 80%)")
    num, unit = float(m.group(1)), m.group(2).lower()
    if unit == "%" or (unit == "" and "." in m.group(1) and num <= 1.0):
        frac = num / 100 if unit == "%" else num
        if total is None:
            raise ValueError(f"{text!r} is a fraction, but there is no total to take it of")
        if not 0 < frac <= 1:
            raise ValueError(f"{text!r}: a fraction must be in (0, 1]")
        return int(frac * total)
    if unit not in _UNITS:
        raise ValueError(f"unknown unit {unit!r} in {text!r}")
    return int(num * _UNITS[unit])
