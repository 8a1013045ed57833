"""deploy/k8s, the perimeter (docs/deploy.md, "Trust boundaries"): the NetworkPolicies admit only routers to
hostds and only Prometheus to metrics; every certificate a container is told to read is mounted from a Secret
that cert-manager issues, with the identities ground/tls.py expects; the cert-manager and Gateway API objects
(custom resources, so not schema-checked) hang together; the base sets no default tenant and no dev mode."""

from __future__ import annotations

from pathlib import PurePosixPath

import pytest
import yaml

from tests.deploy.conftest import DEPLOY, OVERLAYS, run, tool
from tests.deploy.test_manifests import mmhost_containers, objects, resolve_env, run_role

MONITORING = {"kubernetes.io/metadata.name": "monitoring"}
# Settings fields that name a certificate file, per role.
CERT_FIELDS = {
    "hostd": ("tls_cert", "tls_key", "tls_client_ca"),
    "router": ("tls_cert", "tls_key", "hostd_ca", "hostd_client_cert", "hostd_client_key"),
}
SECRET_KEYS = {"tls.crt", "tls.key", "ca.crt"}  # what a cert-manager Secret (or `mmhost certs` one) holds


def pod_labels(rendered, overlay, role) -> dict:
    (wl, _, _), = [x for x in mmhost_containers(rendered, overlay) if x[2]["args"][0] == role]
    return wl["spec"]["template"]["metadata"]["labels"]


def container(rendered, overlay, role):
    (x,) = [x for x in mmhost_containers(rendered, overlay) if x[2]["args"][0] == role]
    return x


def settings(rendered, overlay, role, clean_env):
    _, _, c = container(rendered, overlay, role)
    return run_role(c, resolve_env(rendered, overlay, c), clean_env)


def selects(selector: dict, labels: dict) -> bool:
    assert set(selector) <= {"matchLabels"}, "only matchLabels selectors are checked here"
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def policy_for(rendered, overlay, role) -> dict:
    labels = pod_labels(rendered, overlay, role)
    (np,) = [n for n in objects(rendered, overlay, "NetworkPolicy") if selects(n["spec"]["podSelector"], labels)]
    assert "Ingress" in np["spec"]["policyTypes"]
    return np


def port_number(c, p) -> int:
    if isinstance(p["port"], int):
        return p["port"]
    (n,) = [cp["containerPort"] for cp in c["ports"] if cp["name"] == p["port"]]
    return n


def certificates(rendered, overlay) -> dict[str, dict]:
    """secretName -> the Certificate that issues it."""
    out = {}
    for cert in objects(rendered, overlay, "Certificate"):
        name = cert["spec"]["secretName"]
        assert name not in out, f"two Certificates write Secret {name}"
        out[name] = cert
    return out


# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("overlay", OVERLAYS)
def test_hostd_admits_only_router_pods_on_grpc_and_the_data_link_and_prometheus_on_metrics(rendered, overlay,
                                                                                            clean_env):
    hs = settings(rendered, overlay, "hostd", clean_env)["HostdSettings"]
    _, _, c = container(rendered, overlay, "hostd")
    router, hostd = pod_labels(rendered, overlay, "router"), pod_labels(rendered, overlay, "hostd")
    admitted = set()
    for rule in policy_for(rendered, overlay, "hostd")["spec"].get("ingress", []):
        assert rule.get("from"), "a rule without `from` admits every pod in the cluster"
        assert rule.get("ports"), "a rule without `ports` admits every port"
        ports = {port_number(c, p) for p in rule["ports"]}
        for peer in rule["from"]:
            assert "ipBlock" not in peer
            if "namespaceSelector" in peer:
                assert peer["namespaceSelector"] == {"matchLabels": MONITORING}
                assert "podSelector" not in peer or selects(peer["podSelector"], {})  # or narrower
                admitted |= {("monitoring", p) for p in ports}
            else:
                assert selects(peer["podSelector"], router) and not selects(peer["podSelector"], hostd)
                admitted |= {("router", p) for p in ports}
    grpc_port = int(hs.listen.rpartition(":")[2])
    assert admitted == {("router", grpc_port), ("router", hs.data_port), ("monitoring", hs.metrics_port)}
    assert grpc_port != 8001, "Triton's port: a Triton client pointed at it must not reach a hostd"
    assert hs.health_port and ("router", hs.health_port) not in admitted


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_router_admits_tenants_on_grpc_and_only_prometheus_on_metrics(rendered, overlay, clean_env):
    rs = settings(rendered, overlay, "router", clean_env)["RouterSettings"]
    _, _, c = container(rendered, overlay, "router")
    open_ports, monitoring = set(), set()
    for rule in policy_for(rendered, overlay, "router")["spec"].get("ingress", []):
        assert rule.get("ports"), "a rule without `ports` admits every port"
        ports = {port_number(c, p) for p in rule["ports"]}
        if not rule.get("from"):
            open_ports |= ports
        else:
            assert rule["from"] == [{"namespaceSelector": {"matchLabels": MONITORING}}]
            monitoring |= ports
    assert open_ports == {int(rs.listen.rpartition(":")[2])}, "tenants reach only the TLS port"
    assert monitoring == {rs.metrics_port}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_tls_is_on_and_every_certificate_file_is_mounted_from_an_issued_secret(rendered, overlay, clean_env):
    from ground import tls

    issued = certificates(rendered, overlay)
    used: dict[tuple[str, str], dict] = {}  # (role, field) -> the Certificate whose Secret holds the file
    for _, spec, c in mmhost_containers(rendered, overlay):
        role = c["args"][0]
        s = settings(rendered, overlay, role, clean_env)["HostdSettings" if role == "hostd" else "RouterSettings"]
        assert not s.plaintext, f"{role} must not be told to serve plaintext"
        mounts = {m["mountPath"]: m for m in c.get("volumeMounts", [])}
        volumes = {v["name"]: v for v in spec["volumes"]}
        for field in CERT_FIELDS[role]:
            path = getattr(s, field)
            assert path is not None, f"{overlay}/{role}: {field} is not set"
            path = PurePosixPath(str(path))
            mount = mounts.get(str(path.parent))
            assert mount, f"{overlay}/{role}: {field}={path} is not in a mounted folder"
            assert mount.get("readOnly") is True
            secret = volumes[mount["name"]].get("secret")
            assert secret, f"{role}: {path.parent} is not a Secret volume"
            assert path.name in SECRET_KEYS and "items" not in secret
            assert secret["secretName"] in issued, f"no Certificate issues Secret {secret['secretName']}"
            # Keys readable by the container's group only, through fsGroup.
            assert secret["defaultMode"] == 0o440 and spec["securityContext"]["fsGroup"] == \
                spec["securityContext"]["runAsGroup"]
            used[(role, field)] = issued[secret["secretName"]]["spec"]

    hs = settings(rendered, overlay, "hostd", clean_env)["HostdSettings"]
    rs = settings(rendered, overlay, "router", clean_env)["RouterSettings"]
    # The router's client certificate names the identity hostds admit.
    client = used[("router", "hostd_client_cert")]
    assert hs.tls_client_identity == tls.ROUTER_IDENTITY in client["uris"] and "client auth" in client["usages"]
    # hostd's serving certificate carries the name routers verify whatever pod IP they dial.
    hostd = used[("hostd", "tls_cert")]
    assert rs.hostd_tls_name in hostd["dnsNames"] and "server auth" in hostd["usages"]
    # The router's serving certificate names the router Service.
    served = used[("router", "tls_cert")]
    assert {"mmhost-router", "mmhost-router.mmhost.svc"} <= set(served["dnsNames"]) and "server auth" in served["usages"]
    # Each side trusts the CA that signed the other: one issuer for both certificates of each hop.
    assert used[("hostd", "tls_client_ca")]["issuerRef"] == client["issuerRef"]
    assert used[("router", "hostd_ca")]["issuerRef"] == hostd["issuerRef"]
    # Cert and key of one pair come from one Secret.
    for role, pairs in (("hostd", [("tls_cert", "tls_key")]),
                        ("router", [("tls_cert", "tls_key"), ("hostd_client_cert", "hostd_client_key")])):
        for a, b in pairs:
            assert used[(role, a)] is used[(role, b)]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_cert_manager_objects(rendered, overlay):
    """Own checks for cert-manager's kinds: every Certificate's issuer is rendered; the CA issuer's Secret is a
    CA Certificate from the self-signed issuer; leaves are short-lived, renewed early, with new keys."""
    issuers = {i["metadata"]["name"]: i for i in objects(rendered, overlay, "Issuer")}
    issued = certificates(rendered, overlay)
    assert objects(rendered, overlay, "Certificate"), "components/tls is in every overlay"
    for cert in issued.values():
        assert cert["apiVersion"] == "cert-manager.io/v1"
        ref = cert["spec"]["issuerRef"]
        assert ref["kind"] == "Issuer" and ref["group"] == "cert-manager.io" and ref["name"] in issuers
    for issuer in issuers.values():
        assert issuer["apiVersion"] == "cert-manager.io/v1"
        if "ca" in issuer["spec"]:
            ca = issued[issuer["spec"]["ca"]["secretName"]]["spec"]
            assert ca["isCA"] is True
            assert "selfSigned" in issuers[ca["issuerRef"]["name"]]["spec"]
        else:
            assert issuer["spec"] == {"selfSigned": {}}
    for secret, cert in issued.items():
        spec = cert["spec"]
        if spec.get("isCA"):
            continue
        assert not set(spec["usages"]) - {"digital signature", "server auth", "client auth"}, secret
        assert "ca" in issuers[spec["issuerRef"]["name"]]["spec"], "leaves come from the CA, not self-signed"
        assert spec["privateKey"]["rotationPolicy"] == "Always"
        assert int(spec["renewBefore"].rstrip("h")) * 2 <= int(spec["duration"].rstrip("h"))


def test_gateway_balances_calls_across_routers_over_tls(rendered):
    """Own checks for Gateway API kinds (gpu overlay): a TLS listener with an issued certificate, a GRPCRoute
    from it to the router Service's gRPC port, and TLS re-encrypted to the routers, verified by name."""
    overlay = "gpu"
    issued = certificates(rendered, overlay)
    (gw,) = objects(rendered, overlay, "Gateway")
    (route,) = objects(rendered, overlay, "GRPCRoute")
    (btls,) = objects(rendered, overlay, "BackendTLSPolicy")
    for o in (gw, route, btls):
        assert o["apiVersion"] == "gateway.networking.k8s.io/v1"
    (listener,) = gw["spec"]["listeners"]
    assert listener["protocol"] == "HTTPS" and listener["tls"]["mode"] == "Terminate"
    (ref,) = listener["tls"]["certificateRefs"]
    assert ref["kind"] == "Secret" and listener["hostname"] in issued[ref["name"]]["spec"]["dnsNames"]
    assert {"kind": "GRPCRoute"} in listener["allowedRoutes"]["kinds"]

    assert route["spec"]["parentRefs"] == [{"name": gw["metadata"]["name"], "sectionName": listener["name"]}]
    (svc,) = [s for s in objects(rendered, overlay, "Service") if s["metadata"]["name"] == "mmhost-router"]
    (grpc_port,) = [p for p in svc["spec"]["ports"] if p["name"] == "grpc"]
    backends = [b for rule in route["spec"]["rules"] for b in rule["backendRefs"]]
    assert backends == [{"name": "mmhost-router", "port": grpc_port["port"]}]

    (target,) = btls["spec"]["targetRefs"]
    assert target == {"group": "", "kind": "Service", "name": "mmhost-router", "sectionName": "grpc"}
    router_cert = issued["mmhost-router-tls"]["spec"]
    assert btls["spec"]["validation"]["hostname"] in router_cert["dnsNames"]
    assert btls["spec"]["validation"]["caCertificateRefs"] == [{"group": "", "kind": "ConfigMap",
                                                                "name": "mmhost-ca-bundle"}]


def test_base_sets_no_default_tenant_and_no_dev_mode(rendered, clean_env):
    r = run([tool("kubectl"), "kustomize", str(DEPLOY / "k8s" / "base")])
    assert r.returncode == 0, r.stderr
    base = [d for d in yaml.safe_load_all(r.stdout) if d]
    forbidden = {"MMHOST_HOSTD_DEFAULT_TENANT", "MMHOST_HOSTD_DEV_MODE", "MMHOST_HOSTD_PLAINTEXT",
                 "MMHOST_ROUTER_PLAINTEXT"}
    for o in base:
        keys = set(o.get("data", {})) if o["kind"] == "ConfigMap" else set()
        if o["kind"] in ("Deployment", "StatefulSet"):
            for c in o["spec"]["template"]["spec"]["containers"]:
                keys |= {e["name"] for e in c.get("env", [])}
        assert not keys & forbidden, f"{o['kind']}/{o['metadata']['name']} sets {keys & forbidden}"
    # The production overlay runs without dev mode; only the dev overlay turns it on.
    assert settings(rendered, "gpu", "hostd", clean_env)["HostdSettings"].dev_mode is False
    dev = settings(rendered, "dev", "hostd", clean_env)["HostdSettings"]
    assert dev.dev_mode is True and dev.default_tenant == "demo"
