"""Write deploy/k8s/components/monitoring/prometheusrule.yaml from mmhost-alerts.rules.yaml, so the Prometheus
Operator gets exactly the rules that promtool checks and tests. Run after editing the rules:

    python deploy/prometheus/make_prometheusrule.py

tests/deploy fails when the PrometheusRule is stale."""

from __future__ import annotations

from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
RULES = HERE / "mmhost-alerts.rules.yaml"
OUT = HERE.parent / "k8s" / "components" / "monitoring" / "prometheusrule.yaml"
HEADER = "# Generated from deploy/prometheus/mmhost-alerts.rules.yaml by deploy/prometheus/make_prometheusrule.py.\n"


def render() -> str:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    obj = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "mmhost-alerts", "labels": {"app.kubernetes.io/name": "mmhost"}},
        "spec": {"groups": groups},
    }
    return HEADER + yaml.safe_dump(obj, sort_keys=False, width=120)


if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT}")
