"""The router's side of upload validation (router/uploads.py), with stand-in worker commands: a worker that
crashes (the runtime died on a crafted file) or hangs is the tenant's model's failure, killed and reported as
INVALID_ARGUMENT model_invalid; a worker that fails otherwise is an internal error; the worker inherits no
credential; one upload at a time per tenant. The worker's tests run on both event loops: the router's (uvloop)
and asyncio's own."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import pytest

from ground import eventloop
from ground.errors import DeadlineExceeded, Internal, InvalidArgument, Unavailable
from ground.settings import RouterSettings
from router.metrics import RouterMetrics
from router.uploads import UploadSlots, Uploads, worker_env
from tests.servers import REPO

LOOPS = pytest.mark.parametrize("loop", ["uvloop", "asyncio"])


def _uploads(code: str = "", timeout_s: float = 30.0, idle_s: float = 30.0,
             validator: tuple[str, ...] | None = None) -> Uploads:
    s = RouterSettings(plaintext=True, upload_validate_timeout_s=timeout_s, upload_idle_timeout_s=idle_s)
    return Uploads(settings=s, authenticate=lambda c: "acme", repo=None, catalog=None, directory=None,  # type: ignore[arg-type]
                   metrics=RouterMetrics(), validator=validator or (sys.executable, "-c", code))


@LOOPS
def test_a_worker_killed_by_a_signal_is_the_models_failure(loop):
    u = _uploads("import os, signal, sys; sys.stdin.read(); os.kill(os.getpid(), signal.SIGSEGV)")
    with pytest.raises(InvalidArgument) as e:
        eventloop.run(u._validate({"model": "m"}), loop)
    assert e.value.reason == "model_invalid" and "crashed its runtime" in e.value.message


@LOOPS
def test_a_hanging_worker_is_killed_at_the_timeout(loop):
    # a worker that never answers: it blocks on an event nobody sets (the router's timeout must kill it)
    u = _uploads("import sys, threading; sys.stdin.read(); threading.Event().wait()", timeout_s=0.5)
    with pytest.raises(InvalidArgument) as e:
        eventloop.run(u._validate({"model": "m"}), loop)
    assert e.value.reason == "model_invalid" and "within 0.5 s" in e.value.message


@LOOPS
def test_a_worker_that_answers_nothing_is_an_internal_error(loop):
    u = _uploads("import sys; sys.stdin.read(); sys.exit(3)")
    with pytest.raises(Internal) as e:
        eventloop.run(u._validate({"model": "m"}), loop)
    assert e.value.message == "model validation failed" and "validator exit 3" in (e.value.detail or "")


@LOOPS
def test_a_worker_that_exits_without_reading_its_request_is_its_failure(loop):
    """A worker that exits without reading a request bigger than a pipe holds: the write meets a closed pipe,
    and the answer is still the worker's failure, with its exit code and what it wrote."""
    u = _uploads("import sys; sys.stderr.write('no reading today'); sys.exit(4)")
    with pytest.raises(Internal) as e:
        eventloop.run(u._validate({"model": "m", "pad": "x" * (1 << 20)}), loop)
    assert e.value.message == "model validation failed"
    assert "validator exit 4" in (e.value.detail or "") and "no reading today" in (e.value.detail or "")


@LOOPS
def test_a_refusal_is_passed_on(loop):
    u = _uploads('import json, sys; sys.stdin.read(); print(json.dumps({"refused": "no good"}))')
    with pytest.raises(InvalidArgument) as e:
        eventloop.run(u._validate({"model": "m"}), loop)
    assert e.value.message == "model refused: no good"


@LOOPS
def test_a_worker_that_cannot_start_is_unavailable(loop, tmp_path):
    u = _uploads(validator=(str(tmp_path / "no-such-validator"),))
    with pytest.raises(Unavailable) as e:
        eventloop.run(u._validate({"model": "m"}), loop)
    assert e.value.message == "model validation could not start; retry later" and e.value.retry_after_ms


def test_the_worker_starts_without_the_routers_at_fork_hooks():
    """The router's loop is uvloop, whose own subprocess start forks the router and runs Python's at-fork hooks
    in the child before exec; in a router with busy gRPC threads, gRPC's fork handlers there killed the
    worker (ground/async_child.py). Here a hook that aborts any child it runs in stands for them: the worker
    must still start and answer, on the router's loop, in a process of its own (the hook is for ever)."""
    script = textwrap.dedent("""
        import os, sys
        from ground import eventloop
        from ground.errors import InvalidArgument
        from ground.settings import RouterSettings
        from router.metrics import RouterMetrics
        from router.uploads import Uploads

        os.register_at_fork(after_in_child=os.abort)
        code = 'import json, sys; sys.stdin.read(); print(json.dumps({"refused": "ran"}))'
        u = Uploads(settings=RouterSettings(plaintext=True), authenticate=None, repo=None, catalog=None,
                    directory=None, metrics=RouterMetrics(), validator=(sys.executable, "-c", code))
        try:
            eventloop.run(u._validate({"model": "m"}), "uvloop")
        except InvalidArgument as e:
            print(e.message)
    """)
    run = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "model refused: ran", run.stderr[-2000:]


def test_the_worker_inherits_no_credential():
    env = worker_env({"PATH": "/bin", "PYTHONPATH": "/src", "AWS_SECRET_ACCESS_KEY": "s", "AWS_PROFILE": "p",
                      "MMHOST_REDIS_URL": "redis://x", "MMHOST_S3_ENDPOINT_URL": "http://s3", "CUDA_VISIBLE_DEVICES": "0"})
    assert env == {"PATH": "/bin", "PYTHONPATH": "/src", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}


def test_one_upload_per_tenant_and_a_total():
    s = UploadSlots(2)
    assert s.acquire("a") and not s.acquire("a") and s.acquire("b") and not s.acquire("c")
    s.release("a")
    assert s.acquire("c")


def test_a_stalled_upload_gives_its_place_back():
    u = _uploads(idle_s=0.2)

    async def stalled():
        await asyncio.sleep(3600)
        yield b""

    with pytest.raises(DeadlineExceeded):
        asyncio.run(u.publish(stalled(), None))
    assert u.slots.busy == set()
    assert u.metrics.uploads.labels("acme", "deadline")._value.get() == 1


def test_only_the_verdict_is_taken_from_the_worker():
    """A worker taken over by a crafted model cannot make the router write elsewhere."""
    from ground.manifest import ModelFormat, ModelManifest, TensorSpec
    from router.uploads import _check_answer

    t = [TensorSpec(name="x", datatype="FP32", shape=[-1, 2])]
    ok = ModelManifest(tenant="acme", model="m", version="1", format=ModelFormat.ONNX, model_file="model.onnx",
                       inputs=t, outputs=t)
    _check_answer(ok, "acme", "m", "1")
    for bad in ({"tenant": "globex"}, {"model": "other"}, {"version": "2"}):
        with pytest.raises(Internal):
            _check_answer(ok.model_copy(update=bad), "acme", "m", "1")
    with pytest.raises(Internal):
        _check_answer(ok.model_copy(update={"model_file": "../../globex/models/m/1/model.onnx"}), "acme", "m", "1")


def test_a_missing_upload_dir_is_refused_at_start(tmp_path):
    with pytest.raises(ValueError, match="upload_dir"):
        Uploads(settings=RouterSettings(plaintext=True, upload_dir=tmp_path / "nope"), authenticate=lambda c: "acme",
                repo=None, catalog=None, directory=None, metrics=RouterMetrics())  # type: ignore[arg-type]
