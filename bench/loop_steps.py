"""Which callbacks hold an event loop, in every Python process a command starts: runs COMMAND with
bench/loop_steps_hook on PYTHONPATH (its sitecustomize times each asyncio callback of each process), then
prints per process the steps longer than --ms, their wall and thread-CPU time, and where the loop thread
was while the longest ran (its Python frames; time in C shows as the line that called into it).

    python -m bench.loop_steps [--ms 8] [--top 5] -- python -m bench.storms

docs/byte-storms.md reads the router's and hostd's steps during a storm this way."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

HOOK = Path(__file__).resolve().parent / "loop_steps_hook"


def read_steps(d: Path) -> dict[str, list[tuple[float, float, list[str]]]]:
    """Per process (its command line): (wall ms, CPU ms, sampled frames) of each long step."""
    out: dict[str, list[tuple[float, float, list[str]]]] = defaultdict(list)
    for f in sorted(d.glob("*.txt")):
        key = None
        for line in f.read_text().splitlines():
            if line.startswith("step "):
                _, wall, cpu, *cmd = line.split(" ")
                key = f"pid {f.stem}: {' '.join(cmd)}"
                out[key].append((float(wall), float(cpu), []))
            elif line.startswith("  at ") and key is not None:
                out[key][-1][2].append(line[5:])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ms", type=float, default=8.0, help="report steps at least this long")
    ap.add_argument("--top", type=int, default=5, help="the longest steps shown per process")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        ap.error("give the command to run after --")
    with tempfile.TemporaryDirectory() as d:
        env = {**os.environ, "MMHOST_LOOP_STEPS_DIR": d, "MMHOST_LOOP_STEPS_MS": str(a.ms),
               "PYTHONPATH": os.pathsep.join(p for p in (str(HOOK), os.environ.get("PYTHONPATH")) if p)}
        rc = subprocess.call(cmd, env=env)
        for proc, steps in read_steps(Path(d)).items():
            walls = sorted(s[0] for s in steps)
            print(f"\n{proc}: {len(steps)} steps >= {a.ms:g} ms; median {walls[len(walls) // 2]:.1f} ms, "
                  f"longest {walls[-1]:.1f} ms")
            for wall, cpu, frames in sorted(steps, reverse=True)[:a.top]:
                print(f"  {wall:7.1f} ms (thread CPU {cpu:.1f} ms)")
                for fr in frames[:3]:
                    print(f"      at {fr}")
    sys.exit(rc)


if __name__ == "__main__":
    main()
