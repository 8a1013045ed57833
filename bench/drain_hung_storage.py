"""How long a hostd takes to exit after SIGTERM while its storage hangs (accepts connections, never answers),
with storage's timeouts at their defaults (S3Settings: 20 s read timeout, 4 attempts) and a 2 s drain: one
request waits on a load from that storage when the signal comes. Prints the exit time against the drain's
own budget (drain + linger) and the pod's grace (deploy/: terminationGracePeriodSeconds 45, preStop 5 s).

    .venv/bin/python -m bench.drain_hung_storage [--drain 2] [--read-timeout 20] [--attempts 4]
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from protos import grpc_service_pb2 as pb  # noqa: E402
from tests.hostd_proc import HostdProc  # noqa: E402  (starts `mmhost hostd` as a process)
from tests.servers import SilentServer  # noqa: E402

LINGER_S = 1.0  # HostdSettings.drain_linger_s's default
GRACE_AFTER_PRESTOP_S = 45 - 5


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drain", type=float, default=2.0, help="MMHOST_HOSTD_DRAIN_TIMEOUT_S")
    ap.add_argument("--read-timeout", type=float, default=20.0, help="MMHOST_S3_READ_TIMEOUT_S")
    ap.add_argument("--attempts", type=int, default=4, help="MMHOST_S3_MAX_ATTEMPTS")
    a = ap.parse_args()
    with SilentServer() as store, tempfile.TemporaryDirectory() as work:
        env = {"MMHOST_S3_ENDPOINT_URL": store.url, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
               "MMHOST_S3_READ_TIMEOUT_S": str(a.read_timeout), "MMHOST_S3_MAX_ATTEMPTS": str(a.attempts),
               "MMHOST_HOSTD_DRAIN_TIMEOUT_S": str(a.drain)}
        h = HostdProc("s3://models/store", Path(work), env=env)
        call = h.stub.ModelInfer.future(pb.ModelInferRequest(model_name="m"), timeout=600)
        while store.accepted == 0:
            time.sleep(0.05)
        print(f"hostd is inside a storage call ({store.accepted} connection(s) taken, none answered); SIGTERM")
        t0 = time.monotonic()
        rc = h.stop(signal.SIGTERM, timeout=600)
        took = time.monotonic() - t0
        err = call.exception()
        print(f"the waiting request: {err.code().name if err else 'OK'}")
        budget = a.drain + LINGER_S
        print(f"exit status {rc} after {took:.1f} s: {took / budget:.2f}x the drain + linger ({budget:.0f} s); "
              f"the pod's grace after preStop is {GRACE_AFTER_PRESTOP_S} s: "
              f"{'holds' if rc == 0 and took <= GRACE_AFTER_PRESTOP_S else 'SIGKILLed in a pod'}")


if __name__ == "__main__":
    main()
