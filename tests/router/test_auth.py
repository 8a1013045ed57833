"""router/auth.py: how a tenant is known from its API key (`authorization: Bearer <key>`, any case and
whitespace) and/or its client certificate's tenant; each refusal names its case and never a tenant."""

from __future__ import annotations

import pytest

from router.auth import CASES, AuthError, KeyIndex, bearer, hash_key, new_key, parse_bearer

KEY = new_key()
OTHER = new_key()


@pytest.fixture()
def keys() -> KeyIndex:
    return KeyIndex({hash_key(KEY): "acme", hash_key(OTHER): "globex"})


@pytest.mark.parametrize("value", [f"Bearer {KEY}", f" Bearer {KEY}", f"bearer {KEY}", f"BEARER  {KEY} ",
                                   f"\tBearer\t{KEY}\t"])
def test_accepted_spellings(keys, value):
    md = (("x-other", "1"), ("authorization", value))
    assert parse_bearer(md) == KEY
    assert keys.authenticate(md) == "acme"


def test_bytes_value_and_first_authorization_wins():
    assert parse_bearer((("authorization", f"Bearer {KEY}".encode()),)) == KEY
    assert parse_bearer((("authorization", f"Bearer {KEY}"), ("authorization", "Basic x"))) == KEY


def _refused(keys, md, cert=None) -> AuthError:
    with pytest.raises(AuthError) as e:
        keys.authenticate(md, cert)
    return e.value


@pytest.mark.parametrize("md", [(), None, (("x-api-key", KEY),)])
def test_no_authorization_metadata(keys, md):
    e = _refused(keys, md)
    assert e.case == "no_credential"
    assert str(e) == CASES["no_credential"] and "no authorization metadata" in str(e)


@pytest.mark.parametrize("value", [f"Basic {KEY}", KEY, "Bearer", "Bearer   ", "", "Token " + KEY, f"Bearer{KEY}"])
def test_not_a_bearer_credential(keys, value):
    e = _refused(keys, (("authorization", value),))
    assert e.case == "not_bearer"
    assert "not a Bearer credential" in str(e)
    assert bearer((("authorization", value),)) is None


@pytest.mark.parametrize("key", ["mmk_" + "x" * 43, "not-a-key", "mmk_" + "y" * 200])
def test_unknown_or_revoked_key(keys, key):
    e = _refused(keys, (("authorization", f"Bearer {key}"),))
    assert e.case == "unknown_key"
    assert str(e) == "unknown or revoked API key"
    for tenant in ("acme", "globex"):  # no hint about which tenants exist
        assert tenant not in str(e)


def test_revoked_key_after_refresh(keys):
    md = (("authorization", f"Bearer {KEY}"),)
    assert keys.authenticate(md) == "acme"
    keys.replace({hash_key(OTHER): "globex"})
    assert _refused(keys, md).case == "unknown_key"


def test_certificate_alone(keys):
    assert keys.authenticate((), "acme") == "acme"


def test_certificate_and_key_of_the_same_tenant(keys):
    assert keys.authenticate((("authorization", f"Bearer {KEY}"),), "acme") == "acme"


def test_certificate_and_key_of_different_tenants(keys):
    e = _refused(keys, (("authorization", f"Bearer {OTHER}"),), "acme")
    assert e.case == "mismatch" and "different tenants" in str(e)
    assert "acme" not in str(e) and "globex" not in str(e)


def test_certificate_of_an_unknown_tenant(keys):
    for md in ((), (("authorization", f"Bearer {KEY}"),)):
        e = _refused(keys, md, "initech")
        assert e.case == "unknown_cert" and "initech" not in str(e)


def test_certificate_with_a_bad_key_is_refused(keys):
    assert _refused(keys, (("authorization", "Bearer mmk_nope"),), "acme").case == "unknown_key"
    assert _refused(keys, (("authorization", "Basic x"),), "acme").case == "not_bearer"
