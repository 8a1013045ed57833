"""deploy/k8s: every overlay renders (kubectl kustomize) and validates against the Kubernetes schemas offline
(kubernetes-validate); each mmhost container's command runs through the real CLI with the environment the
manifests give it, and every MMHOST_* variable, port, probe and drain time matches what that code reads."""

from __future__ import annotations

import base64
import re
from unittest import mock

import pytest
from typer.testing import CliRunner

from tests.deploy.conftest import OVERLAYS

# Custom resources: not in the Kubernetes schemas, so skipped by the schema check and checked by their own
# tests below: Prometheus Operator (and test_prometheus.py: the PrometheusRule's rules are the promtool-checked
# file), cert-manager (components/tls) and Gateway API (components/gateway).
PROMETHEUS_KINDS = {"ServiceMonitor", "PrometheusRule"}
CERT_MANAGER_KINDS = {"Certificate", "Issuer", "ClusterIssuer"}
GATEWAY_KINDS = {"Gateway", "GRPCRoute", "BackendTLSPolicy"}
CRD_KINDS = PROMETHEUS_KINDS | CERT_MANAGER_KINDS | GATEWAY_KINDS
K8S_VERSIONS = ["1.30.0", "1.37.0"]
# Non-MMHOST variables a container may set: the AWS credential chain (boto3) and helpers for $(VAR) expansion.
ALLOWED_OTHER_ENV = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION", "POD_IP"}
FAKE_POD_IP = "10.1.2.3"


def objects(rendered, overlay, kind=None):
    return [o for o in rendered[overlay] if kind is None or o["kind"] == kind]


def mmhost_containers(rendered, overlay):
    """(workload, pod spec, container) for each container running the mmhost image."""
    for o in rendered[overlay]:
        if o["kind"] in ("Deployment", "StatefulSet"):
            spec = o["spec"]["template"]["spec"]
            for c in spec["containers"]:
                if c["image"].split(":")[0].endswith("mmhost"):
                    yield o, spec, c


def resolve_env(rendered, overlay, c) -> dict[str, str]:
    """The environment Kubernetes gives the container: envFrom ConfigMaps, env values, ConfigMap/Secret refs,
    the downward API (pod IP faked) and $(VAR) expansion."""
    cms = {o["metadata"]["name"]: o.get("data", {}) for o in objects(rendered, overlay, "ConfigMap")}
    secrets = {o["metadata"]["name"]: {k: base64.b64decode(v).decode() for k, v in o.get("data", {}).items()}
               for o in objects(rendered, overlay, "Secret")}
    env: dict[str, str] = {}
    for src in c.get("envFrom", []):
        name = src["configMapRef"]["name"]
        assert name in cms, f"envFrom names a ConfigMap that is not rendered: {name}"
        env.update(cms[name])
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], e["value"])
        elif "configMapKeyRef" in e.get("valueFrom", {}):
            ref = e["valueFrom"]["configMapKeyRef"]
            env[e["name"]] = cms[ref["name"]][ref["key"]]
        elif "secretKeyRef" in e.get("valueFrom", {}):
            ref = e["valueFrom"]["secretKeyRef"]
            # A Secret the operator creates (gpu overlay) stands in with a plausible value.
            env[e["name"]] = secrets.get(ref["name"], {}).get(ref["key"], "redis://redis.example:6379/0"
                                                             if "REDIS" in ref["key"] else "placeholder")
        elif e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.podIP":
            env[e["name"]] = FAKE_POD_IP
        else:
            pytest.fail(f"unhandled env source {e}")
    return env


def run_role(c, env, clean_env) -> dict:
    """Run the container's command through the real `mmhost` CLI with its environment; the role's serve() is
    replaced by a recorder, so what comes back is exactly the settings objects the role would serve with."""
    from mmhost.cli import app

    assert "command" not in c, "the image's ENTRYPOINT (mmhost) runs; the args pick the role"
    role = c["args"][0]
    captured = {}

    def fake_serve(*args, **kw):
        captured["settings"] = [a for a in (*args, *kw.values()) if a is not None]

    for k, v in env.items():
        clean_env.setenv(k, v)
    with mock.patch(f"{role}.server.serve", fake_serve):
        r = CliRunner().invoke(app, c["args"], catch_exceptions=False)
    assert r.exit_code == 0, f"mmhost {' '.join(c['args'])} failed:\n{r.output}"
    assert captured, f"mmhost {role} did not reach {role}.server.serve"
    return {type(s).__name__: s for s in captured["settings"]}


def reads(cls, name, value, clean_env) -> bool:
    """True when `cls` takes a value from environment variable `name` (alone in the environment)."""
    import os

    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("MMHOST_")}
    try:
        clean_env.setenv(name, value)
        return bool(cls().model_fields_set)
    finally:
        clean_env.delenv(name)
        os.environ.update(saved)


def sleep_seconds(c) -> float:
    cmd = c["lifecycle"]["preStop"]["exec"]["command"]
    assert cmd[0] == "sleep"
    return float(cmd[1])


def port(c, name) -> int:
    (p,) = [p["containerPort"] for p in c["ports"] if p["name"] == name]
    return p


# ---------------------------------------------------------------------------------------------------------------

def test_overlays_exist():
    assert {"dev", "gpu"} <= set(OVERLAYS)


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_rendered_objects_validate_against_kubernetes_schemas(rendered, overlay, version):
    import kubernetes_validate

    checked = 0
    for o in rendered[overlay]:
        if o["kind"] in CRD_KINDS:
            continue
        kubernetes_validate.validate(o, version, strict=True)
        checked += 1
    assert checked >= 10


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_mmhost_env_var_is_read_by_the_role_that_gets_it(rendered, overlay, clean_env):
    roles = set()
    for _, _, c in mmhost_containers(rendered, overlay):
        env = resolve_env(rendered, overlay, c)
        settings = run_role(c, env, clean_env)
        roles.add(c["args"][0])
        for name, value in env.items():
            if not name.startswith("MMHOST_"):
                assert name in ALLOWED_OTHER_ENV, f"{c['name']}: {name} is read by nothing in mmhost"
                continue
            readers = [n for n, s in settings.items() if reads(type(s), name, value, clean_env)]
            assert readers, f"{overlay}/{c['name']}: {name} is not read by any of {sorted(settings)}"
    assert roles == {"hostd", "router"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_ports_probes_and_scrape_targets_match_the_settings(rendered, overlay, clean_env):
    from hostd.server import SERVICE as HOSTD_SERVICE
    from router.forward import SERVICE as ROUTER_SERVICE

    services = objects(rendered, overlay, "Service")
    for wl, _spec, c in mmhost_containers(rendered, overlay):
        role = c["args"][0]
        s = run_role(c, resolve_env(rendered, overlay, c), clean_env)
        main = s["HostdSettings" if role == "hostd" else "RouterSettings"]
        host, _, grpc_port = main.listen.rpartition(":")
        assert host == "0.0.0.0", f"{role} must listen on all addresses in a pod"
        assert port(c, "grpc") == int(grpc_port)
        assert main.metrics_host == "0.0.0.0" and port(c, "metrics") == main.metrics_port > 0
        ann = wl["spec"]["template"]["metadata"]["annotations"]
        assert int(ann["prometheus.io/port"]) == main.metrics_port
        # The kubelet's gRPC probes cannot speak TLS: with TLS on, they go to the plaintext health-only port.
        probe_port = main.health_port if main.tls_cert else int(grpc_port)
        if main.health_port:
            assert port(c, "health") == main.health_port != int(grpc_port)
        if role == "hostd":  # the data link has a fixed port of its own, on neither gRPC's nor health's
            assert port(c, "data") == main.data_port > 0
            assert main.data_port not in (int(grpc_port), main.health_port, main.metrics_port)
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            if probe not in c:
                continue
            g = c[probe]["grpc"]
            assert g["port"] == probe_port
            assert g.get("service", "") in ("", HOSTD_SERVICE if role == "hostd" else ROUTER_SERVICE)
        if role == "hostd":
            assert s["HeartbeatSettings"].advertise == f"{FAKE_POD_IP}:{grpc_port}", "routers call this address"
            assert s["HeartbeatSettings"].redis_url, "hosts must heartbeat to Redis to be found by routers"
        # The role's Service exposes these container ports by name.
        labels = wl["spec"]["template"]["metadata"]["labels"]
        mine = [sv for sv in services if sv["spec"].get("selector") and
                all(labels.get(k) == v for k, v in sv["spec"]["selector"].items())]
        assert mine, f"no Service selects {role}"
        for sv in mine:
            for p in sv["spec"]["ports"]:
                assert p["targetPort"] in {cp["name"] for cp in c["ports"]}
                assert p["port"] == port(c, p["targetPort"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_hostd_drains_within_its_grace_period_and_has_its_tiers(rendered, overlay, clean_env):
    from ground.units import parse_bytes

    (wl, spec, c), = [x for x in mmhost_containers(rendered, overlay) if x[2]["args"][0] == "hostd"]
    assert wl["kind"] == "StatefulSet"
    hs = run_role(c, resolve_env(rendered, overlay, c), clean_env)["HostdSettings"]
    pre = sleep_seconds(c)
    assert spec["terminationGracePeriodSeconds"] >= pre + hs.drain_timeout_s + hs.drain_linger_s + 5
    live = c["livenessProbe"]
    assert live["periodSeconds"] * live.get("failureThreshold", 3) > pre + hs.drain_timeout_s + hs.drain_linger_s, \
        "liveness must not kill a draining hostd"
    # The disk tier is a mounted volume big enough for its bound; the RAM tier fits in the memory limit.
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == str(hs.cache_dir)]
    (vol,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    assert "emptyDir" in vol or "persistentVolumeClaim" in vol
    if "emptyDir" in vol:
        assert parse_bytes(vol["emptyDir"]["sizeLimit"].replace("i", "iB")) >= parse_bytes(hs.disk_cache_bytes)
    assert parse_bytes(c["resources"]["limits"]["memory"].replace("i", "iB")) > parse_bytes(hs.ram_cache_bytes)
    assert 0 < hs.low_watermark < hs.high_watermark <= 1
    # Budget and watermarks come from the ConfigMap, not literals in the pod spec.
    literal = {e["name"] for e in c.get("env", [])}
    for k in ("MMHOST_HOSTD_DEVICE_MEMORY", "MMHOST_HOSTD_HIGH_WATERMARK", "MMHOST_HOSTD_LOW_WATERMARK"):
        assert k not in literal
    assert any("configMapRef" in src for src in c["envFrom"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_router_scales_out_and_stops_cleanly(rendered, overlay):
    (wl, spec, c), = [x for x in mmhost_containers(rendered, overlay) if x[2]["args"][0] == "router"]
    assert wl["kind"] == "Deployment" and wl["spec"]["replicas"] >= 2
    assert wl["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert spec["terminationGracePeriodSeconds"] >= sleep_seconds(c) + 10
    (hpa,) = objects(rendered, overlay, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": wl["metadata"]["name"]}
    assert 2 <= hpa["spec"]["minReplicas"] < hpa["spec"]["maxReplicas"]
    pod_labels = wl["spec"]["template"]["metadata"]["labels"]
    for pdb in objects(rendered, overlay, "PodDisruptionBudget"):
        sel = pdb["spec"]["selector"]["matchLabels"]
        assert any(all(x[0]["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in sel.items())
                   for x in mmhost_containers(rendered, overlay)), f"PDB {pdb['metadata']['name']} selects nothing"
        if sel == {k: pod_labels[k] for k in sel}:
            assert pdb["spec"]["minAvailable"] < hpa["spec"]["minReplicas"], "a PDB that blocks every drain"


def test_s3_credentials_come_from_a_secret(rendered):
    for overlay in OVERLAYS:
        for _, _, c in mmhost_containers(rendered, overlay):
            for e in c.get("env", []):
                if e["name"].startswith("AWS_") or e["name"] == "MMHOST_REDIS_URL":
                    assert "secretKeyRef" in e.get("valueFrom", {}), f"{e['name']} must come from a Secret"
        for cm in objects(rendered, overlay, "ConfigMap"):
            assert not any(k.startswith("AWS_") for k in cm.get("data", {})), "credentials in a ConfigMap"


def test_gpu_overlay_puts_one_hostd_on_each_gpu(rendered, clean_env):
    (wl, spec, c), = [x for x in mmhost_containers(rendered, "gpu") if x[2]["args"][0] == "hostd"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert spec["nodeSelector"] and any(t["key"] == "nvidia.com/gpu" for t in spec["tolerations"])
    assert c["image"].endswith(":gpu")
    assert run_role(c, resolve_env(rendered, "gpu", c), clean_env)["HostdSettings"].device == "cuda"


def test_dev_overlay_is_cpu_with_its_own_redis(rendered, clean_env):
    (wl, spec, c), = [x for x in mmhost_containers(rendered, "dev") if x[2]["args"][0] == "hostd"]
    assert "nvidia.com/gpu" not in str(c["resources"]) and c["image"].endswith(":cpu")
    assert run_role(c, resolve_env(rendered, "dev", c), clean_env)["HostdSettings"].device == "cpu"
    redis = [o for o in objects(rendered, "dev", "StatefulSet") if o["metadata"]["name"] == "redis"]
    assert redis
    url = resolve_env(rendered, "dev", c)["MMHOST_REDIS_URL"]
    host = re.match(r"redis://([^:/]+)", url).group(1)
    assert host in {s["metadata"]["name"] for s in objects(rendered, "dev", "Service")}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_prometheus_operator_objects(rendered, overlay):
    """Own checks for the CRD kinds: each ServiceMonitor selects a Service and scrapes a port it names."""
    services = objects(rendered, overlay, "Service")
    for sm in objects(rendered, overlay, "ServiceMonitor"):
        assert sm["apiVersion"] == "monitoring.coreos.com/v1"
        sel = sm["spec"]["selector"]["matchLabels"]
        (sv,) = [s for s in services if all(s["metadata"].get("labels", {}).get(k) == v for k, v in sel.items())]
        assert sv["metadata"]["name"] == sm["metadata"]["name"], "job label = Service name, as the alerts expect"
        for ep in sm["spec"]["endpoints"]:
            assert ep["port"] in {p["name"] for p in sv["spec"]["ports"]}
    for pr in objects(rendered, overlay, "PrometheusRule"):
        assert pr["apiVersion"] == "monitoring.coreos.com/v1" and pr["spec"]["groups"]
    if overlay == "gpu":
        assert {o["kind"] for o in rendered[overlay]} >= PROMETHEUS_KINDS
