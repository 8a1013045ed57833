"""The one deadline rule (ground/deadlines.py): earliest of the gRPC deadline and the `timeout` parameter;
the server's default only when the call has neither; INF when there is none at all."""

from __future__ import annotations

import pytest

from ground.deadlines import INF, deadline_at, remaining_s

NOW = 1000.0


def test_the_grpc_deadline_alone():
    assert deadline_at(NOW, 2.0) == NOW + 2.0


def test_the_timeout_parameter_alone_is_in_microseconds():
    assert deadline_at(NOW, None, timeout_us=500_000) == pytest.approx(NOW + 0.5)


@pytest.mark.parametrize(("grpc_remaining", "timeout_us", "expected"), [
    (2.0, 500_000, NOW + 0.5),  # the timeout parameter is earlier
    (0.25, 500_000, NOW + 0.25),  # the gRPC deadline is earlier
])
def test_the_earliest_of_both_wins(grpc_remaining, timeout_us, expected):
    assert deadline_at(NOW, grpc_remaining, timeout_us) == pytest.approx(expected)


def test_the_default_applies_only_when_the_call_has_neither():
    assert deadline_at(NOW, None, None, default_s=3.0) == NOW + 3.0
    assert deadline_at(NOW, 10.0, None, default_s=3.0) == NOW + 10.0  # not shortened by the default
    assert deadline_at(NOW, None, 5_000_000, default_s=3.0) == pytest.approx(NOW + 5.0)


def test_no_deadline_at_all_is_inf():
    assert deadline_at(NOW, None) == INF
    assert deadline_at(NOW, None, timeout_us=None, default_s=0.0) == INF


def test_a_zero_or_negative_timeout_parameter_means_none():
    assert deadline_at(NOW, None, timeout_us=0) == INF
    assert deadline_at(NOW, 1.0, timeout_us=-5) == NOW + 1.0


def test_an_expired_grpc_deadline_stays_in_the_past():
    assert deadline_at(NOW, -0.5) == NOW - 0.5


def test_remaining_seconds():
    assert remaining_s(INF, NOW) is None
    assert remaining_s(NOW + 2.0, NOW) == 2.0
    assert remaining_s(NOW - 1.0, NOW) == -1.0  # passed: the caller sheds it
