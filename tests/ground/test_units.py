"""Byte sizes from the command line (ground/units.py)."""

from __future__ import annotations

import pytest

from ground.units import parse_bytes


def test_parse_bytes():
    assert parse_bytes("8GiB") == 8 << 30
    assert parse_bytes("0.5", total=1000) == 500 and parse_bytes("25%", total=1000) == 250
    with pytest.raises(ValueError):
        parse_bytes("0.5")  # a fraction needs a total
    with pytest.raises(ValueError):
        parse_bytes("12 parsecs")


@pytest.mark.parametrize(("text", "expected"), [
    ("1234", 1234), ("512MiB", 512 << 20), ("8GB", 8 * 10**9), (" 2 kib ", 2048), ("1.5KiB", 1536), (77, 77),
])
def test_absolute_sizes(text, expected):
    assert parse_bytes(text) == expected


def test_a_fraction_must_be_in_zero_to_one():
    with pytest.raises(ValueError):
        parse_bytes("0%", total=1000)
    with pytest.raises(ValueError):
        parse_bytes("150%", total=1000)
    assert parse_bytes("100%", total=1000) == 1000
