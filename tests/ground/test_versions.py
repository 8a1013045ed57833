"""Version selection under a model's version policy (ground/versions.py)."""

from __future__ import annotations

import pytest

from ground.manifest import VersionPolicy
from ground.versions import VersionNotFound, latest, resolve_version

VERSIONS = ["1", "2", "10"]


def test_latest_is_numeric_when_versions_are_integers():
    assert latest(VERSIONS) == "10"
    with pytest.raises(VersionNotFound):
        latest([])


def test_a_requested_version_wins_over_the_policy():
    pinned = VersionPolicy(kind="pinned", version="1")
    assert resolve_version(VERSIONS, pinned, "2", 0.5) == "2"
    with pytest.raises(VersionNotFound):
        resolve_version(VERSIONS, VersionPolicy(), "3", 0.5)


def test_pinned():
    assert resolve_version(VERSIONS, VersionPolicy(kind="pinned", version="2"), None, 0.9) == "2"
    with pytest.raises(VersionNotFound):
        resolve_version(VERSIONS, VersionPolicy(kind="pinned", version="7"), None, 0.9)


def test_split_follows_the_uniform_draw():
    split = VersionPolicy(kind="split", weights={"1": 0.75, "2": 0.25})
    assert resolve_version(VERSIONS, split, None, 0.0) == "1"
    assert resolve_version(VERSIONS, split, None, 0.74) == "1"
    assert resolve_version(VERSIONS, split, None, 0.76) == "2"
    assert resolve_version(VERSIONS, split, None, 0.999) == "2"


def test_split_ignores_missing_and_zero_weight_versions_and_falls_back_to_latest():
    split = VersionPolicy(kind="split", weights={"1": 0.0, "7": 1.0, "2": 1.0})
    assert resolve_version(VERSIONS, split, None, 0.0) == "2"  # "1" has no weight, "7" is not stored
    gone = VersionPolicy(kind="split", weights={"7": 1.0})
    assert resolve_version(VERSIONS, gone, None, 0.3) == "10"
