"""Policy modules stay pure: no I/O, no clock, no network or server libraries, directly or through the
project modules they import. They take `now` and state and return decisions, so sim/ and the unit tests
drive exactly the code that serves (see /work/shared/STYLE.md, "Keep policy pure").

Checked on the source with `ast` (every import statement, at module level or inside a function), so a
lazy `import time` inside a function is caught too, and nothing is imported to check it."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROJECT = {"ground", "catalog", "storage_adapters", "hostd", "router", "sim", "mmhost", "protos", "bench"}
FORBIDDEN = {
    # clock
    "time", "datetime", "sched",
    # concurrency and event loops
    "asyncio", "threading", "multiprocessing", "concurrent", "signal",
    # I/O: files, processes, network
    "os", "io", "pathlib", "shutil", "tempfile", "subprocess", "socket", "ssl", "select", "selectors",
    "http", "urllib",
    # servers, stores, metrics
    "grpc", "grpc_health", "grpc_reflection", "boto3", "botocore", "redis", "prometheus_client",
}


def policy_modules() -> list[Path]:
    tracked = subprocess.run(["git", "ls-files", "*policy*.py"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    files = {ROOT / f for f in tracked if not f.startswith("tests/")}
    files |= {ROOT / "ground/deadlines.py", ROOT / "router/failover.py"}
    files |= set((ROOT / "hostd/core").rglob("*.py"))  # the host core: what hostd and sim/ both drive
    return sorted(f for f in files if f.exists())


def imported(source: str, package: str = "") -> list[tuple[int, str]]:
    """(line, absolute module name) for every import statement in `source`; `package` resolves relative
    imports."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.append((node.lineno, mod))
            # `from pkg import sub` may name a submodule
            out += [(node.lineno, f"{mod}.{a.name}") for a in node.names if _module_file(f"{mod}.{a.name}")]
    return out


def _module_file(name: str) -> Path | None:
    if name.split(".")[0] not in PROJECT:
        return None
    p = ROOT.joinpath(*name.split("."))
    for f in (p.with_suffix(".py"), p / "__init__.py"):
        if f.is_file():
            return f
    return None


def _with_packages(name: str) -> list[str]:
    """`a.b.c` runs a/__init__.py and a/b/__init__.py before a/b/c.py."""
    parts = name.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def impurities(source: str, name: str) -> list[str]:
    """Every forbidden import reachable from `source` (the module `name`) through project modules, each
    as the chain of imports that reaches it."""
    found: list[str] = []
    seen = {name}
    todo = [(source, name, f"{name}")]
    while todo:
        src, mod, chain = todo.pop()
        package = mod if _module_file(mod) and _module_file(mod).name == "__init__.py" else mod.rpartition(".")[0]
        for line, target in imported(src, package):
            top = target.split(".")[0]
            if top in FORBIDDEN:
                found.append(f"{chain}:{line} imports {target}")
            for m in _with_packages(target):
                f = _module_file(m)
                if f is not None and m not in seen:
                    seen.add(m)
                    todo.append((f.read_text(), m, f"{chain}:{line} -> {m}"))
    return sorted(found)


def _name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def test_the_checker_flags_clock_io_and_server_imports():
    assert impurities("import time\n", "x") == ["x:1 imports time"]
    assert impurities("def f():\n    from time import monotonic\n    return monotonic()\n", "x") == \
        ["x:2 imports time"]
    assert impurities("import os.path\nimport grpc.aio as g\n", "x") == \
        ["x:1 imports os.path", "x:2 imports grpc.aio"]
    assert impurities("import math\nfrom dataclasses import dataclass\n", "x") == []
    # through a project module: ground.settings uses pathlib
    assert any("-> ground.settings" in f for f in impurities("from ground.settings import HostdSettings\n", "x"))


def test_there_are_policy_modules():
    names = {_name(p) for p in policy_modules()}
    assert {"hostd.batch_policy", "hostd.cache.policy", "ground.deadlines", "router.failover"} <= names


@pytest.mark.parametrize("path", policy_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_policy_module_is_pure(path: Path):
    found = impurities(path.read_text(), _name(path))
    assert not found, "a policy module must not do I/O or read a clock:\n" + "\n".join(found)
