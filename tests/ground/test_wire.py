"""The wire contract (ground/wire.py): trailer helpers and the reason vocabulary."""

from __future__ import annotations

from ground.wire import (
    HOST_LEAVING,
    REASON,
    RETRY_AFTER,
    TRY_ELSEWHERE,
    Reason,
    heartbeat_index_key,
    heartbeat_status_key,
    reason_of,
    retry_after_ms,
    trailer,
)


def test_trailer_finds_a_key_in_str_or_bytes_metadata():
    md = (("a", "1"), (REASON, b"queue_full"), (RETRY_AFTER, "250"))
    assert trailer(md, "a") == "1"
    assert trailer(md, REASON) == "queue_full"  # bytes are decoded
    assert trailer(md, "missing") is None
    assert trailer(None, "a") is None and trailer((), "a") is None


def test_the_first_value_of_a_repeated_key_wins():
    assert trailer((("k", "first"), ("k", "second")), "k") == "first"


def test_reason_of_reads_the_mmhost_reason_trailer():
    assert reason_of(((REASON, Reason.DRAINING.value),)) == "draining"
    assert reason_of((("grpc-status", "14"),)) is None  # no mmhost process answered
    assert reason_of(None) is None


def test_retry_after_ms_is_an_int_or_none():
    assert retry_after_ms(((RETRY_AFTER, "250"),)) == 250
    assert retry_after_ms(((RETRY_AFTER, b"40"),)) == 40
    assert retry_after_ms(((RETRY_AFTER, "soon"),)) is None  # garbage is ignored, never raised
    assert retry_after_ms(()) is None and retry_after_ms(None) is None


def test_reason_values_are_unique_snake_case_strings():
    values = [r.value for r in Reason]
    assert len(values) == len(set(values))
    assert all(v == v.lower() and " " not in v for v in values)
    assert {r.name.lower() for r in Reason} == set(values)


def test_host_leaving_and_try_elsewhere_are_disjoint_sets_of_reasons():
    values = {r.value for r in Reason}
    assert HOST_LEAVING <= values and TRY_ELSEWHERE <= values
    assert not HOST_LEAVING & TRY_ELSEWHERE
    # a model's own failure is never a reason to try another host or mark this one down
    assert Reason.LOAD_FAILED.value not in HOST_LEAVING | TRY_ELSEWHERE
    assert Reason.MODEL_FAILED.value not in HOST_LEAVING | TRY_ELSEWHERE


def test_heartbeat_keys_live_under_the_prefix():
    assert heartbeat_index_key("p:") == "p:index"
    assert heartbeat_status_key("p:", "host-1") == "p:h:host-1"
    assert heartbeat_index_key("p:") != heartbeat_status_key("p:", "index")
