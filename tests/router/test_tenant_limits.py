"""Tenant limits in the registry and `mmhost tenant create|set-limits|list`: a tier plus only the fields set
per tenant, stored with the record (file and Redis); records from before limits read as "unlimited"."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from catalog.index import connect_redis
from mmhost.cli import app
from ground.tenancy import TIERS
from router.tenants import FileTenants, RedisTenants


def run(*args: str, code: int = 0) -> str:
    res = CliRunner().invoke(app, ["tenant", *args])
    assert res.exit_code == code, res.output
    return res.output


def key_of(output: str) -> str:
    return next(line for line in output.splitlines() if line.startswith("mmk_"))


def test_create_with_tier_and_overrides_then_set_limits_keeps_what_is_not_given(tmp_path):
    f = str(tmp_path / "t.json")
    key = key_of(run("create", "acme", "--tier", "free", "--rate", "5", "--max-concurrency", "2", "--tenants", f))
    stored = json.loads(open(f).read())["tenants"]["acme"]
    assert stored["limits"] == {"tier": "free", "rate": 5.0, "max_concurrency": 2}  # only what was set
    lim = FileTenants(f).get("acme").limits
    assert (lim.rate, lim.max_concurrency, lim.burst, lim.instances) == (5, 2, TIERS["free"].burst, 1)
    run("set-limits", "acme", "--burst", "9", "--tenants", f)
    lim = FileTenants(f).get("acme").limits
    assert (lim.tier, lim.rate, lim.burst, lim.max_concurrency) == ("free", 5, 9, 2)
    run("set-limits", "acme", "--tier", "premium", "--reset", "--tenants", f)
    assert FileTenants(f).get("acme").limits == TIERS["premium"]
    listing = run("list", "--tenants", f)
    assert "tier premium" in listing and "rate 1000/s" in listing and key not in listing
    assert "unknown tier" in run("set-limits", "acme", "--tier", "gold", "--tenants", f, code=1)
    assert "invalid limits" in run("set-limits", "acme", "--rate", "-1", "--tenants", f, code=1)
    assert FileTenants(f).get("acme").limits == TIERS["premium"]  # a refused change changes nothing
    key2 = key_of(run("rotate-key", "acme", "--tenants", f))
    assert key2 != key and FileTenants(f).get("acme").limits == TIERS["premium"]  # limits survive rotation


def test_old_records_without_limits_read_as_unlimited(tmp_path):
    f = tmp_path / "t.json"
    f.write_text(json.dumps({"tenants": {"old": {"key_sha256": "ab" * 32, "created": 1.0, "rotated": 0.0}}}))
    reg = FileTenants(f)
    assert reg.limits() == {"old": TIERS["unlimited"]}
    assert "tier unlimited" in run("list", "--tenants", str(f))


def test_redis_registry_stores_limits_in_the_record(redis_server):
    reg = RedisTenants(connect_redis(redis_server.url), "limits-test:tenants:")
    reg.create("initech", "standard", {"weight": 3})
    raw = json.loads(reg.r.hget("limits-test:tenants:by-name", "initech"))
    assert raw["limits"] == {"tier": "standard", "weight": 3} and "key_sha256" in raw
    reg.set_limits("initech", overrides={"instances": 2})
    lim = reg.limits()["initech"]
    assert (lim.tier, lim.weight, lim.instances, lim.rate) == ("standard", 3, 2, TIERS["standard"].rate)
    assert set(reg.by_hash().values()) >= {"initech"}
