"""A virtual environment of its own for nvidia-pytriton (bench/pytriton_server.py), made by the bench when
missing, never by tests: .mmhost-cache/pytriton-venv, with nvidia-pytriton and onnxruntime from PyPI.

Why not the project's environment (a `bench` extra): nvidia-pytriton 0.7 requires numpy 1.x, protobuf 6 and
tritonclient 2.73, and installing it there downgrades numpy 2.x and protobuf 7 under every other package.

pytriton's Triton Python backend stub links libpython3.X.so.1.0 and the loader finds the system's copy first
(Debian's 3.11.2 under a pyenv 3.11.7 reads the newer standard library and fails in multiprocessing):
`server_env` puts the interpreter's own library directory first on LD_LIBRARY_PATH."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".mmhost-cache" / "pytriton-venv"
PACKAGES = ["nvidia-pytriton==0.7.0", "onnxruntime"]


def python() -> Path:
    return VENV / "bin" / "python"


def ensure() -> tuple[Path | None, str]:
    """The environment's interpreter, made when missing; (None, why) when it cannot be made."""
    py = python()
    ok = py.exists() and subprocess.run([str(py), "-c", "import pytriton, onnxruntime"],
                                        capture_output=True).returncode == 0
    if ok:
        return py, "ok"
    print(f"installing {' '.join(PACKAGES)} into {VENV} (once; a few minutes)", flush=True)
    r = subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], capture_output=True, text=True)
    if r.returncode != 0:
        return None, f"python -m venv failed: {r.stderr.strip()[-300:]}"
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", *PACKAGES], capture_output=True, text=True)
    if r.returncode != 0:
        return None, f"pip install {' '.join(PACKAGES)} failed: {(r.stderr or r.stdout).strip()[-300:]}"
    return py, "ok"


def server_env(py: Path) -> dict[str, str]:
    """The environment for the pytriton server process: the interpreter's libpython found first."""
    libdir = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_config_var('LIBDIR') or '')"],
                            capture_output=True, text=True).stdout.strip()
    env = dict(os.environ)
    if libdir:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (libdir, env.get("LD_LIBRARY_PATH", "")) if p)
    return env
