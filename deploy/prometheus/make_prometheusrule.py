"""Write deploy/k8s/components/monitoring/prometheusrule.yaml from mmhost-alerts.rules.yaml, so the Prometheus
Operator gets exactly the rules that promtool checks and tests. Run after editing the rules:

    python deploy/prometheus/make_prometheusrule.py [--runbook-base URL] [--rules-out FILE]

Runbook links are absolute URLs under one base: every alert's `runbook_url` is RUNBOOK_BASE + "<alert>.md" in
the rules file (docs/runbooks/<alert>.md in this repository). `--runbook-base` replaces that base in what is
written (publish docs/runbooks/ there); `--rules-out` also writes a plain rules file (a Prometheus without the
operator) with it. tests/deploy fails when the committed PrometheusRule is stale."""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
RULES = HERE / "mmhost-alerts.rules.yaml"
OUT = HERE.parent / "k8s" / "components" / "monitoring" / "prometheusrule.yaml"
HEADER = "# Generated from deploy/prometheus/mmhost-alerts.rules.yaml by deploy/prometheus/make_prometheusrule.py.\n"
RUNBOOK_BASE = "https://mmhost.example.com/runbooks/"


def groups(runbook_base: str = RUNBOOK_BASE) -> list[dict]:
    """The rule groups, each alert's runbook_url under `runbook_base`."""
    if not runbook_base.startswith(("https://", "http://")):
        raise SystemExit(f"--runbook-base must be an absolute http(s) URL, not {runbook_base!r}")
    base = runbook_base if runbook_base.endswith("/") else runbook_base + "/"
    out = yaml.safe_load(RULES.read_text())["groups"]
    for g in out:
        for r in g["rules"]:
            if "alert" in r:
                want = f"{RUNBOOK_BASE}{r['alert']}.md"
                if r["annotations"].get("runbook_url") != want:
                    raise SystemExit(f"{r['alert']}: runbook_url must be {want} in {RULES.name}")
                r["annotations"]["runbook_url"] = f"{base}{r['alert']}.md"
    return out


def render(runbook_base: str = RUNBOOK_BASE) -> str:
    obj = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "mmhost-alerts", "labels": {"app.kubernetes.io/name": "mmhost"}},
        "spec": {"groups": groups(runbook_base)},
    }
    return HEADER + yaml.safe_dump(obj, sort_keys=False, width=120)


def render_rules(runbook_base: str = RUNBOOK_BASE) -> str:
    return HEADER + yaml.safe_dump({"groups": groups(runbook_base)}, sort_keys=False, width=120)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runbook-base", default=RUNBOOK_BASE, help=f"absolute URL runbooks live under ({RUNBOOK_BASE})")
    ap.add_argument("--out", type=Path, default=OUT, help="PrometheusRule to write")
    ap.add_argument("--rules-out", type=Path, help="also write a plain Prometheus rules file")
    a = ap.parse_args()
    a.out.write_text(render(a.runbook_base))
    print(f"wrote {a.out}")
    if a.rules_out:
        a.rules_out.write_text(render_rules(a.runbook_base))
        print(f"wrote {a.rules_out}")
