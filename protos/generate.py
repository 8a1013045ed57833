"""Regenerate the Python code for protos/*.proto. Run from the repository root: python -m protos.generate

The output is committed; tests/protos/test_generated.py fails when it is stale.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTOS = ["protos/model_config.proto", "protos/grpc_service.proto", "protos/hostd_control.proto", "protos/router_header.proto",
          "protos/uploads.proto", "protos/hostd_data.proto"]


def generate(out_dir: Path) -> None:
    from grpc_tools import protoc  # grpcio-tools: a build/test dependency only

    import grpc_tools

    include = str(Path(grpc_tools.__file__).parent / "_proto")
    args = [
        "grpc_tools.protoc",
        f"-I{ROOT}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *[p for p in PROTOS if (ROOT / p).exists()],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
