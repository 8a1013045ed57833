"""Device shares from the environment (MMHOST_HOSTD_TENANT_SHARES, read once at start) and from the tenant
registry (`mmhost tenant set-limits --device-maximum`, live): the registry wins for a tenant it sets a share
for, and a hostd says so (a warning and mmhost_tenant_env_shares_overridden) instead of dropping either silently."""

from __future__ import annotations

import json
import time

from typer.testing import CliRunner

from hostd.cache.policy import Share
from hostd.tenants import merge_shares
from mmhost.cli import app
from router.tenants import FileTenants
from tests.hostd_proc import HostdProc, metric_value


def test_registry_share_wins_over_the_environment_and_names_what_it_overrides():
    env = {"a": Share(guaranteed=10, maximum=100), "b": Share(guaranteed=0, maximum=50)}
    registry = {"a": Share(guaranteed=0, maximum=30), "c": Share(guaranteed=5, maximum=None)}
    shares, overridden = merge_shares(registry, env)
    assert shares == {"a": registry["a"], "b": env["b"], "c": registry["c"]}
    assert overridden == ["a"]
    assert merge_shares({}, env) == (env, [])


def _overridden(h: HostdProc) -> float:
    return metric_value(h.metrics_text(), "mmhost_tenant_env_shares_overridden")


def test_set_limits_overrides_the_env_share_live_and_says_so(tmp_path):
    f = tmp_path / "tenants.json"
    FileTenants(f).create("acme", "standard")
    (tmp_path / "store").mkdir()
    env = {"MMHOST_HOSTD_TENANT_SHARES": json.dumps({"acme": {"maximum": "60%"}}),
           "MMHOST_HOSTD_TENANTS_REFRESH_S": "0.2"}
    h = HostdProc(str(tmp_path / "store"), tmp_path, env=env, args=["--tenant-limits", str(f)])
    try:
        assert _overridden(h) == 0  # the registry sets no share for acme yet: the environment's holds
        res = CliRunner().invoke(app, ["tenant", "set-limits", "acme", "--tenants", str(f), "--device-maximum", "10%"])
        assert res.exit_code == 0, res.output
        deadline = time.monotonic() + 15
        while _overridden(h) != 1:
            assert time.monotonic() < deadline, h.log()
            time.sleep(0.1)
        assert "tenant registry shares override MMHOST_HOSTD_TENANT_SHARES for acme" in h.log()
    finally:
        h.stop()
