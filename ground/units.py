"""Byte sizes from the command line: '512MiB', '8GB', '1234', or a fraction of a total ('0.8', '80%')."""

from __future__ import annotations

import re

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z%]*)\s*$")


SMALLEST_BARE = 1 << 20  # with a total, a unitless integer below this is refused as ambiguous


def parse_bytes(text: str | int, total: int | None = None) -> int:
    """Absolute sizes need a unit or an integer; '0.8' or '80%' is a fraction of `total`.

    Where a fraction is possible (`total` given), a unitless integer from 1 to 1 MiB - 1 is refused as
    ambiguous: `--device-memory 1` reads as "all of it" to a person and as one byte to a parser. Write 100%
    or 1.0 for all of it, or give a unit (1GiB, 512B). 0 (off) and larger unitless byte counts are accepted."""
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
    if unit == "" and total is not None and "." not in m.group(1) and 0 < num < SMALLEST_BARE:
        raise ValueError(f"{text!r} is ambiguous: write 100% or 1.0 for all of it, or give a unit (e.g. {text}GiB)")
    if unit not in _UNITS:
        raise ValueError(f"unknown unit {unit!r} in {text!r}")
    return int(num * _UNITS[unit])
