"""deploy/docker: hadolint-clean, and each Dockerfile installs what pyproject declares and starts the `mmhost`
command the package provides. (No Docker engine runs on these machines: this and the lint are how the images
are checked; see deploy/README.md.)"""

from __future__ import annotations

import json
import re
import shlex
import tomllib

import pytest
import typer.main

from tests.deploy.conftest import DEPLOY, ROOT, run, tool

DOCKER = DEPLOY / "docker"
IMAGES = {"cpu": "cpu", "gpu": "gpu"}  # Dockerfile -> the runtime extra it must install
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
BUILD_TOOLS = ("gcc", "g++", "make", "build-essential", "python3-dev", "python3-pip", "python3-venv", "git", "curl")


def stages(path) -> list[dict]:
    """[{'from': image, 'name': alias, 'lines': [(INSTRUCTION, args), ...]}] with continuations joined."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out: list[dict] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        instr, _, args = line.partition(" ")
        instr = instr.upper()
        if instr == "FROM":
            parts = args.split()
            out.append({"from": parts[0], "name": parts[2] if len(parts) > 2 else None, "lines": []})
        elif out:
            out[-1]["lines"].append((instr, args.strip()))
    return out


def _args(stage, instr):
    return [a for i, a in stage["lines"] if i == instr]


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_hadolint_clean(name):
    r = run([tool("hadolint"), "--config", str(DOCKER / ".hadolint.yaml"), str(DOCKER / f"{name}.Dockerfile")])
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_build_stage_installs_the_declared_extras_and_pinned_torch(name):
    build, final = stages(DOCKER / f"{name}.Dockerfile")[0], stages(DOCKER / f"{name}.Dockerfile")[-1]
    assert build["name"] and final["name"] is None, "multi-stage: a named build stage, then the runtime stage"
    runs = " && ".join(_args(build, "RUN"))
    extras = re.findall(r'pip install "\.\[([\w,]+)\]"', runs)
    assert len(extras) == 1, f"one `pip install \".[extras]\"` expected, found {extras}"
    extras = set(extras[0].split(","))
    declared = PYPROJECT["project"]["optional-dependencies"]
    assert extras <= declared.keys()
    assert IMAGES[name] in extras and ({"cpu", "gpu"} - {IMAGES[name]}).isdisjoint(extras), "exactly one of cpu/gpu"
    if name == "gpu":
        assert any(d.startswith("onnxruntime-gpu") for d in declared["gpu"])
        assert any(d.startswith("nvidia-ml-py") for d in declared["gpu"])
    (torch_pin,) = [d for d in declared["torch"] if d.startswith("torch")]
    assert torch_pin in runs.split(), f"torch must be installed as pinned in pyproject: {torch_pin}"
    copied = {a.split()[0] for a in _args(build, "COPY")} | {w for a in _args(build, "COPY") for w in a.split()[:-1]}
    packages = {p.rstrip("*") for p in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert packages | {"pyproject.toml", PYPROJECT["project"]["readme"]} <= copied, "every package the build needs"


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_runtime_stage_is_non_root_without_build_tools_and_starts_mmhost(name, clean_env):
    final = stages(DOCKER / f"{name}.Dockerfile")[-1]
    runs = " ".join(_args(final, "RUN"))
    assert "pip install" not in runs
    installed = re.findall(r"apt-get install ([^&;]+)", runs)
    words = {w for chunk in installed for w in chunk.split() if not w.startswith("-")}
    assert not words & set(BUILD_TOOLS), f"build tools in the final stage: {words & set(BUILD_TOOLS)}"
    assert any("--from=build" in a for a in _args(final, "COPY"))
    (user,) = _args(final, "USER")
    assert user.split(":")[0] not in ("root", "0")
    (entry,) = _args(final, "ENTRYPOINT")
    (cmd,) = _args(final, "CMD")
    assert json.loads(entry) == ["mmhost"] and "mmhost" in PYPROJECT["project"]["scripts"]
    from mmhost.cli import app

    assert json.loads(cmd)[0] in typer.main.get_command(app).commands
    # MMHOST_* set in the image are read by the settings hostd builds.
    from ground.settings import HostdSettings

    for env in _args(final, "ENV"):
        for k, v in (kv.split("=", 1) for kv in shlex.split(env)):
            if k.startswith("MMHOST_"):
                clean_env.setenv(k, v)
                assert HostdSettings().model_fields_set, f"{k} is not a HostdSettings field"
                clean_env.delenv(k)


def test_cpu_image_python_satisfies_requires_python():
    base = re.search(r"PYTHON_IMAGE=python:(\d+)\.(\d+)", (DOCKER / "cpu.Dockerfile").read_text())
    req = re.match(r">=(\d+)\.(\d+)", PYPROJECT["project"]["requires-python"])
    assert base and req and tuple(map(int, base.groups())) >= tuple(map(int, req.groups()))


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_exposed_ports_are_hostds_defaults(name, clean_env):
    """The default CMD is hostd: EXPOSE names its default gRPC and metrics ports (not Triton's 8001), and the
    fixed data port the image's environment sets (hostd's own default is any free port, which a container
    could not publish)."""
    from ground.settings import HostdSettings

    final = stages(DOCKER / f"{name}.Dockerfile")[-1]
    (expose,) = _args(final, "EXPOSE")
    env = dict(re.findall(r"(MMHOST_HOSTD_DATA_PORT)=(\d+)", " ".join(_args(final, "ENV"))))
    s = HostdSettings(data_port=int(env["MMHOST_HOSTD_DATA_PORT"]))
    assert s.data_port > 0
    assert {int(p) for p in expose.split()} == {int(s.listen.rpartition(":")[2]), s.metrics_port, s.data_port}
