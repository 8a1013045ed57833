"""What callers read of errors (ground/errors.py, ground/interceptors.py), without a server: bounded
messages, no internal locations, a request id on every error, the details kept for the log."""

from __future__ import annotations

import logging

import grpc

from ground.errors import MAX_MESSAGE_CHARS, Forwarded, NotFound, Unavailable, public_message, shown
from ground.interceptors import status_of
from ground.wire import REASON, REQUEST_ID


def test_internal_locations_are_replaced_and_ordinary_text_kept():
    text = ("local store /var/lib/mmhost/store: no object 'tenants/acme/models/m/1/model.onnx'; "
            "s3://bucket/prefix at http://10.0.0.7:9000: cannot get; redis://cache:6379/0 refused; localhost:8101")
    out = public_message(text)
    for secret in ("/var/lib", "bucket", "10.0.0.7", "redis://", "9000", "localhost:8101"):
        assert secret not in out, out
    assert "tenants/acme/models/m/1/model.onnx" in out  # the caller's own object key is no secret
    assert public_message("acme/mlp at 10/s, shape [1, -1]") == "acme/mlp at 10/s, shape [1, -1]"


def test_messages_and_echoed_names_are_bounded():
    assert len(public_message("x" * 100_000)) == MAX_MESSAGE_CHARS
    assert shown("n" * 20_000) == repr("n" * 64) + "..." and shown("m") == "'m'"


def test_a_withheld_detail_is_logged_under_the_request_id_the_caller_gets(caplog):
    caplog.set_level(logging.INFO)
    code, text, md = status_of(Unavailable("catalog unavailable; retry later", detail="redis://10.1.1.1:6379 down",
                                           reason="catalog_down", retry_after_ms=1000))
    t = dict(md)
    assert code is grpc.StatusCode.UNAVAILABLE and t[REASON] == "catalog_down" and t["retry-after-ms"] == "1000"
    assert text == f"catalog unavailable; retry later (request id {t[REQUEST_ID]})" and "redis" not in text
    assert t[REQUEST_ID] in caplog.text and "redis://10.1.1.1:6379" in caplog.text


def test_plain_errors_get_an_id_but_keep_their_text_and_internal_errors_say_nothing():
    code, text, md = status_of(NotFound("model 'm' not found"))
    assert (code, text) == (grpc.StatusCode.NOT_FOUND, "model 'm' not found") and dict(md)[REQUEST_ID]
    code, text, md = status_of(KeyError("/secret/path"))
    assert code is grpc.StatusCode.INTERNAL and text == f"internal error (request id {dict(md)[REQUEST_ID]})"


def test_a_forwarded_error_keeps_the_hosts_request_id():
    _, text, md = status_of(Forwarded(grpc.StatusCode.UNAVAILABLE, "x (request id abc)", 5, "storage_down", "abc"))
    assert dict(md)[REQUEST_ID] == "abc" and text == "x (request id abc)"
