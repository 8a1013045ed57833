"""deploy/prometheus: promtool checks and unit-tests the alert rules; every query names series the code exports;
each alert has a runbook; the PrometheusRule in the monitoring component carries exactly these rules."""

from __future__ import annotations

import re

import yaml

from tests.deploy.conftest import DEPLOY, ROOT, run, tool
from tests.deploy.promql import metric_names, selectors

PROM = DEPLOY / "prometheus"
RULES = PROM / "mmhost-alerts.rules.yaml"


def _rules() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def test_promtool_check_rules():
    r = run([tool("promtool"), "check", "rules", str(RULES)])
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in r.stdout


def test_promtool_unit_tests_pass_and_cover_every_alert():
    test_file = PROM / "mmhost-alerts.test.yaml"
    r = run([tool("promtool"), "test", "rules", test_file.name], cwd=PROM)
    assert r.returncode == 0, r.stdout + r.stderr
    tested = {
        case["alertname"]
        for t in yaml.safe_load(test_file.read_text())["tests"]
        for case in t.get("alert_rule_test", [])
        if case.get("exp_alerts")  # a case where it fires, not only one where it stays quiet
    }
    assert {r["alert"] for r in _rules()} <= tested


def test_promtool_unit_tests_catch_a_broken_rule(tmp_path):
    """The unit tests are not vacuous: with the shed threshold raised past the test's shed share they fail."""
    broken = RULES.read_text().replace(") > 0.05", ") > 0.5", 1)
    assert broken != RULES.read_text()
    (tmp_path / RULES.name).write_text(broken)
    (tmp_path / "mmhost-alerts.test.yaml").write_text((PROM / "mmhost-alerts.test.yaml").read_text())
    r = run([tool("promtool"), "test", "rules", "mmhost-alerts.test.yaml"], cwd=tmp_path)
    assert r.returncode != 0 and "MmhostTenantShedding" in r.stdout + r.stderr


def test_rule_queries_name_only_exported_series(exported):
    for rule in _rules():
        names = metric_names(rule["expr"])
        assert names, f"{rule['alert']}: no series found in {rule['expr']!r}"
        unknown = names - exported.keys()
        assert not unknown, f"{rule['alert']} uses series the code does not export: {sorted(unknown)}"
        for name, labels in selectors(rule["expr"]):
            assert labels <= exported[name], f"{rule['alert']}: {name} has no label(s) {labels - exported[name]}"


def _make_prometheusrule():
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_prometheusrule", PROM / "make_prometheusrule.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_runbook_urls_are_absolute_under_one_configurable_base(tmp_path):
    mod = _make_prometheusrule()
    assert mod.RUNBOOK_BASE.startswith("https://") and mod.RUNBOOK_BASE.endswith("/")
    for rule in _rules():
        assert rule["annotations"]["runbook_url"] == f"{mod.RUNBOOK_BASE}{rule['alert']}.md"
    # another base: every alert links under it, in the PrometheusRule and in a plain rules file promtool accepts
    base = "https://wiki.example.org/oncall/mmhost"
    obj = yaml.safe_load(mod.render(base))
    urls = [r["annotations"]["runbook_url"] for g in obj["spec"]["groups"] for r in g["rules"]]
    assert urls == [f"{base}/{r['alert']}.md" for r in _rules()]
    plain = tmp_path / "rules.yaml"
    plain.write_text(mod.render_rules(base))
    r = run([tool("promtool"), "check", "rules", str(plain)])
    assert r.returncode == 0, r.stdout + r.stderr
    assert mod.RUNBOOK_BASE not in plain.read_text()


def test_every_alert_has_a_runbook_that_answers_the_on_call_questions():
    for rule in _rules():
        url = rule["annotations"]["runbook_url"]
        page = ROOT / "docs" / "runbooks" / f"{rule['alert']}.md"
        assert page.exists(), f"{rule['alert']}: runbook {page} missing (linked as {url})"
        text = page.read_text()
        assert text.startswith(f"# {rule['alert']}"), f"{page} must be titled with the alert name"
        for section in ("## What it means", "## Who is causing it", "## What to do"):
            assert section in text, f"{url} lacks '{section}'"
        for series in metric_names(rule["expr"]) - {"up"}:
            assert series in text, f"{url} should show the series the alert is built on: {series}"


def test_prometheusrule_carries_exactly_the_checked_rules():
    mod = _make_prometheusrule()
    assert mod.OUT.read_text() == mod.render(), "stale: run python deploy/prometheus/make_prometheusrule.py"
    obj = yaml.safe_load(mod.OUT.read_text())
    assert obj["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]


def test_host_down_selects_the_job_the_servicemonitor_produces(rendered):
    """The ServiceMonitor's job label is the Service name: `up{job="mmhost-hostd"}` must match a real Service."""
    services = {o["metadata"]["name"] for o in rendered["gpu"] if o["kind"] == "Service"}
    jobs = set(re.findall(r'job="([^"]+)"', RULES.read_text()))
    assert jobs and jobs <= services
    monitored = {o["metadata"]["name"] for o in rendered["gpu"] if o["kind"] == "ServiceMonitor"}
    assert jobs <= monitored
