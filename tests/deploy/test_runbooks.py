"""The kubectl command lines in docs/runbooks/ are real kubectl: no cluster runs here, so each is run against
a kubeconfig whose API server refuses connections, and must get as far as connecting (its subcommand, flags
and arguments parsed by kubectl itself). The mmhost command lines and PromQL queries of the runbooks run against
a real cluster and Prometheus in tests/deploy/test_live_prometheus.py."""

from __future__ import annotations

import os
import re
import shlex
import subprocess

from tests.deploy.conftest import ROOT, tool
from tests.servers import free_port

RUNBOOKS = ROOT / "docs" / "runbooks"
# placeholders in the runbooks -> names kubectl accepts
PLACEHOLDERS = {"<router-pod>": "router-abc", "<hostd-pod>": "hostd-0", "hostd-N": "hostd-0", "--replicas=N": "--replicas=3"}


def kubectl_lines() -> list[tuple[str, str]]:
    out = []
    for page in sorted(RUNBOOKS.glob("*.md")):
        out += [(page.name, m) for m in re.findall(r"`(kubectl [^`\n]+)`", page.read_text())]
    return out


def test_runbook_kubectl_commands_parse(tmp_path):
    lines = kubectl_lines()
    assert len(lines) >= 15, lines
    port = free_port()  # nothing listens there
    cfg = tmp_path / "kubeconfig"
    cfg.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: none, cluster: {{server: "http://127.0.0.1:{port}"}}}}]
users: [{{name: none, user: {{}}}}]
contexts: [{{name: none, context: {{cluster: none, user: none}}}}]
current-context: none
""")
    env = {**os.environ, "KUBECONFIG": str(cfg)}
    for page, line in sorted(set(lines)):
        for k, v in PLACEHOLDERS.items():
            line = line.replace(k, v)
        assert "<" not in line, f"{page}: unknown placeholder in `{line}`"
        args = shlex.split(line)[1:]
        r = subprocess.run([tool("kubectl"), "--request-timeout=2s", *args], capture_output=True, text=True,
                           env=env, timeout=30, stdin=subprocess.DEVNULL)
        out = r.stdout + r.stderr
        assert "unknown" not in out.lower() and "usage" not in out.lower(), f"{page}: `{line}`\n{out}"
        assert f"127.0.0.1:{port}" in out, f"{page}: `{line}` did not get as far as the API server:\n{out}"
