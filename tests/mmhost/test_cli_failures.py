"""The `mmhost` command fails like a good Unix tool: an expected failure prints one line naming what failed and
which flag or environment variable to change, with no traceback, and exits 1 (usage errors exit 2). In
process with typer's CliRunner where possible; through the real entry point (a subprocess) where the failure
comes from a running server or the environment of a fresh process."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from mmhost.cli import app
from tests.servers import REPO, free_port

NO_REDIS = f"redis://127.0.0.1:{free_port()}/0"  # a closed port: connection refused


def run(*args: str, env: dict[str, str] | None = None):
    env = {"COLUMNS": "300", "MMHOST_HOSTD_PLAINTEXT": "true", "MMHOST_ROUTER_PLAINTEXT": "true", **(env or {})}
    return CliRunner().invoke(app, list(args), env=env)


def run_proc(*args: str, env: dict[str, str] | None = None, timeout: float = 90) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MMHOST_")}
    plain = {"MMHOST_HOSTD_PLAINTEXT": "true", "MMHOST_ROUTER_PLAINTEXT": "true"}  # no certificates in these tests
    return subprocess.run([sys.executable, "-m", "mmhost.cli", *args], cwd=REPO, capture_output=True, text=True,
                          env={**clean, **plain, **(env or {})}, timeout=timeout)


def one_error_line(text: str) -> str:
    """The `error:` line, after asserting there is exactly one and no traceback."""
    assert "Traceback" not in text, text
    errors = [line for line in text.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, text
    return errors[0]


@pytest.fixture
def busy_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize("cmd", [["list"], ["create", "acme"], ["rotate-key", "acme"], ["delete", "acme"]])
def test_tenant_commands_with_redis_unreachable(cmd):
    r = run("tenant", *cmd, "--redis", NO_REDIS)
    assert r.exit_code == 1
    assert "Connection refused" in one_error_line(r.output) or "connecting" in r.output


def test_hostd_with_its_port_in_use(tmp_path, busy_port):
    p = run_proc("hostd", "--listen", f"127.0.0.1:{busy_port}", "--store", str(tmp_path), "--metrics-port", "0",
                 "--cache-dir", str(tmp_path / "cache"), "--lazy")
    assert p.returncode == 1, p.stderr
    line = one_error_line(p.stderr)
    assert f"127.0.0.1:{busy_port}" in line and "--listen" in line and "MMHOST_HOSTD_LISTEN" in line


def test_hostd_with_its_metrics_port_in_use(tmp_path, busy_port):
    p = run_proc("hostd", "--listen", f"127.0.0.1:{free_port()}", "--store", str(tmp_path), "--metrics-port",
                 str(busy_port), "--cache-dir", str(tmp_path / "cache"), "--lazy")
    assert p.returncode == 1, p.stderr
    line = one_error_line(p.stderr)
    assert "in use" in line and str(busy_port) in line and "--metrics-port" in line


def test_invalid_setting_from_the_environment_names_the_variable():
    r = run("hostd", env={"MMHOST_HOSTD_HIGH_WATERMARK": "2"})
    assert r.exit_code == 1
    line = one_error_line(r.output)
    assert "MMHOST_HOSTD_HIGH_WATERMARK" in line and "--high-watermark" in line and "'2'" in line


def test_invalid_setting_from_a_flag_names_the_flag():
    r = run("router", "--metrics-port", "70000")
    assert r.exit_code == 1
    line = one_error_line(r.output)
    assert "--metrics-port" in line and "MMHOST_ROUTER_METRICS_PORT" in line


def test_device_memory_1_is_refused_as_ambiguous():
    r = run("hostd", "--device-memory", "1")
    assert r.exit_code == 1
    line = one_error_line(r.output)
    assert "ambiguous" in line and "100%" in line and "--device-memory" in line


def test_a_missing_file(tmp_path):
    r = run("hostd", "--store", str(tmp_path), "--tenant-limits", str(tmp_path / "nope.json"), "--metrics-port", "0",
            "--cache-dir", str(tmp_path / "cache"))
    assert r.exit_code == 1
    assert "nope.json" in one_error_line(r.output)


def test_top_once_with_redis_unreachable_exits_1():
    r = run("top", "--once", "--redis", NO_REDIS)
    assert r.exit_code == 1
    assert "--redis" in one_error_line(r.output)


def test_catalog_list_on_a_missing_folder_exits_1(tmp_path):
    r = run("catalog", "list", "--store", str(tmp_path / "missing"))
    assert r.exit_code == 1
    assert "no such folder" in r.output and "Traceback" not in r.output


def test_version():
    r = run("--version")
    assert r.exit_code == 0 and r.output.startswith("mmhost ")


def test_help_shows_defaults_and_variables():
    out = run("hostd", "--help").output
    assert "default: 127.0.0.1:8101" in out and "MMHOST_HOSTD_DEVICE_MEMORY" in out and "default: 0.8" in out
    out = run("router", "--help").output
    assert "MMHOST_ROUTER_LISTEN" in out and "default: 9100" in out


def test_usage_errors_exit_2():
    assert run("hostd", "--no-such-flag").exit_code == 2


def test_debug_shows_the_traceback_of_expected_failures_too(tmp_path):
    r = run("tenant", "list", "--redis", NO_REDIS, env={"MMHOST_DEBUG": "1"})
    assert r.exception is not None and type(r.exception).__name__ == "ConnectionError"
    r = run("hostd", "--store", str(tmp_path), "--tenant-limits", str(tmp_path / "nope.json"), "--metrics-port", "0",
            "--cache-dir", str(tmp_path / "cache"), env={"MMHOST_DEBUG": "1"})
    assert isinstance(r.exception, FileNotFoundError)


def test_a_bug_keeps_its_traceback():
    from mmhost.cli_errors import explain

    assert explain(KeyError("x"), "hostd") is None and explain(ZeroDivisionError(), None) is None


def test_an_old_variable_name_still_works_and_warns():
    p = run_proc("tenant", "list", env={"MMHOST_ROUTER_REDIS_URL": NO_REDIS})
    assert p.returncode == 1
    assert "warning: MMHOST_ROUTER_REDIS_URL is an old name: use MMHOST_REDIS_URL" in p.stderr
    assert NO_REDIS.split("//")[1].split("/")[0] in one_error_line(p.stderr)  # it was read


def test_old_and_shared_names_reach_the_settings(monkeypatch):
    from ground.settings import HeartbeatSettings, HostdSettings, RouterSettings

    for k in [k for k in os.environ if k.startswith("MMHOST_") or k in ("REDIS_URL", "STORE")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("MMHOST_HOSTD_HEARTBEAT_REDIS_URL", "redis://old:1")
    monkeypatch.setenv("MMHOST_ROUTER_REDIS_URL", "redis://old:2")
    monkeypatch.setenv("MMHOST_STORE", "/shared")
    assert HeartbeatSettings().redis_url == "redis://old:1" and RouterSettings().redis_url == "redis://old:2"
    assert HostdSettings().store == "/shared" and RouterSettings().store == "/shared"
    monkeypatch.setenv("MMHOST_REDIS_URL", "redis://new")
    monkeypatch.setenv("MMHOST_HOSTD_STORE", "/own")
    assert HeartbeatSettings().redis_url == "redis://new" and HostdSettings().store == "/own"
    assert HostdSettings(store="/flag").store == "/flag" and HeartbeatSettings(redis_url="redis://f").redis_url == "redis://f"
    monkeypatch.setenv("REDIS_URL", "redis://not-ours")  # a bare name is not ours to read
    monkeypatch.delenv("MMHOST_REDIS_URL")
    monkeypatch.delenv("MMHOST_ROUTER_REDIS_URL")
    assert RouterSettings().redis_url is None


def test_demo_refuses_when_its_ports_are_taken_and_keeps_the_key(tmp_path, busy_port):
    from router.tenants import FileTenants

    work = tmp_path / "demo"
    work.mkdir()
    FileTenants(work / "tenants.json").create("demo")
    before = (work / "tenants.json").read_text()
    r = run("demo", "--listen", f"127.0.0.1:{busy_port}", "--hostd-ports", f"{free_port()},{free_port()}",
            "--metrics-port", str(free_port()), "--workdir", str(work), "--store", str(tmp_path / "store"))
    assert r.exit_code == 1
    assert f"127.0.0.1:{busy_port}" in one_error_line(r.output)
    assert (work / "tenants.json").read_text() == before and not (tmp_path / "store").exists()
    assert json.loads(before)["tenants"]["demo"]


def test_demo_refuses_while_another_demo_holds_the_workdir(tmp_path):
    import fcntl

    work = tmp_path / "demo"
    work.mkdir()
    with open(work / "demo.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        r = run("demo", "--listen", f"127.0.0.1:{free_port()}", "--hostd-ports", f"{free_port()},{free_port()}",
                "--metrics-port", str(free_port()), "--workdir", str(work), "--store", str(tmp_path / "store"))
    assert r.exit_code == 1
    assert "another `mmhost demo`" in one_error_line(r.output)
