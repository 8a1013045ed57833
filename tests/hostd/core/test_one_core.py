"""One host core, two shells: the simulator and hostd drive the same core classes (not copies), and
hostd's asyncio shell shows the core's lifecycle on a virtual clock (a fake loader; time only moves when
the test moves it)."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import numpy as np
import pytest

import hostd.batcher
import hostd.core.device
import hostd.core.dispatch
import hostd.core.lifecycle
import hostd.core.queue
import hostd.core.slots
import hostd.execution
import hostd.manager
import sim.cluster
from ground.errors import Unavailable
from ground.manifest import FileEntry, ModelFormat, ModelManifest, TensorSpec
from ground.settings import HostdSettings
from hostd.core.device import DeviceCache
from hostd.core.dispatch import Dispatcher
from hostd.core.lifecycle import Lifecycle, ModelState
from hostd.core.queue import ModelQueue
from hostd.core.residency import Residency
from hostd.core.slots import ExecutionSlots
from hostd.entry import ModelEntry
from hostd.execution import ExecutionGate
from hostd.loader import LoadResult
from hostd.manager import ModelManager
from hostd.metrics import HostdMetrics
from hostd.runtimes.base import LoadedModel
from hostd.tensors import DecodedRequest
from sim.cluster import Cluster, ClusterConfig, run_cluster
from sim.costs import ComputeCost, CostModel
from sim.workload import ModelSpec, Workload


def test_the_simulator_runs_the_host_core_classes():
    specs = [ModelSpec("t/m0/1", "t", 100), ModelSpec("u/m1/1", "u", 100)]
    wl = Workload(specs, np.array([0.0, 0.0, 0.5]), np.array([0, 1, 0], dtype=np.int64))
    c = Cluster(wl, ClusterConfig(device_bytes=1000, slots=1))
    c.run()
    host = c.hosts[0]
    assert type(host.cache) is DeviceCache and type(host.slots) is ExecutionSlots
    assert type(host.dispatch) is Dispatcher and type(host.residency) is Residency
    assert all(hm.life is host.residency.life(m) for m, hm in host.models.items())
    assert {type(hm.queue) for hm in host.models.values()} == {ModelQueue}
    assert {type(hm.life) for hm in host.models.values()} == {Lifecycle}
    assert sim.cluster.DeviceCache is hostd.core.device.DeviceCache
    assert sim.cluster.ModelQueue is hostd.core.queue.ModelQueue
    assert sim.cluster.ExecutionSlots is hostd.core.slots.ExecutionSlots
    assert sim.cluster.Lifecycle is hostd.core.lifecycle.Lifecycle
    assert sim.cluster.Dispatcher is hostd.core.dispatch.Dispatcher
    assert sim.cluster.Residency is hostd.manager.Residency


def test_hostd_runs_the_same_core_classes():
    assert hostd.manager.DeviceCache is DeviceCache and hostd.manager.Residency is Residency
    assert hostd.batcher.ModelQueue is ModelQueue
    assert hostd.execution.ExecutionSlots is ExecutionSlots and hostd.execution.Dispatcher is Dispatcher
    gate = ExecutionGate(2, lambda t: 1.0)
    assert type(gate.core) is Dispatcher and type(gate.core.slots) is ExecutionSlots


def test_host_slots_in_the_simulator_serialize_batches():
    # two models, one host slot: the second model's batch waits for the first to finish
    specs = [ModelSpec("t/m0/1", "t", 10), ModelSpec("u/m1/1", "u", 10)]
    wl = Workload(specs, np.array([0.0, 0.0, 5.0, 5.0]), np.array([0, 1, 0, 1], dtype=np.int64))
    costs = CostModel(load_fixed_s=1.0, load_s_per_byte={"storage": 0.0, "disk": 0.0, "host_ram": 0.0},
                      compute_default=ComputeCost(0.010, 0.0))
    free = run_cluster(wl, ClusterConfig(device_bytes=1000), costs).total.latencies
    one = run_cluster(wl, ClusterConfig(device_bytes=1000, slots=1), costs).total.latencies
    # t=0: loads of 1 s each, one loader (done at 1 and 2); t=5: both hot, one batch each
    assert sorted(free) == pytest.approx([0.010, 0.010, 1.010, 2.010])
    assert sorted(one) == pytest.approx([0.010, 0.020, 1.010, 2.010])  # one slot: one batch after the other


# ---- hostd's shell on a virtual clock ----------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Identity(LoadedModel):
    def run(self, inputs, outputs):
        return {"y": inputs["x"]}

    def close(self) -> None:
        pass


class FakeLoader:
    """Counts loads; fails while `fail` is set. No storage, no tiers."""

    def __init__(self) -> None:
        self.calls = 0
        self.fail = False
        self.ram = None
        self.disk = SimpleNamespace(used=0)
        self.models: dict[str, LoadedModel] = {}  # model name -> what loading it gives (default Identity)
        self.stall: threading.Event | None = None
        self.reserves: list[int] = []  # what each load was told the version took when last loaded

    def load(self, m: ModelManifest, progress=None, reserve_bytes: int = 0) -> LoadResult:
        self.calls += 1
        self.reserves.append(reserve_bytes)
        if self.fail:
            raise RuntimeError("corrupt weights")
        if self.stall is not None:  # storage that accepts the request and then sends nothing
            progress.start_fetch()
            self.stall.wait(10)
            raise StorageDown()
        timings = {"download": 0.0, "deserialize": 0.0, "warmup": 0.0}
        return LoadResult(self.models.get(m.model, Identity()), m.total_bytes, True, "disk", timings)


def _manifest(model: str, size: int = 100) -> ModelManifest:
    return ModelManifest(
        tenant="t", model=model, version="1", format=ModelFormat.ONNX, model_file="model.onnx",
        inputs=[TensorSpec(name="x", datatype="FP32", shape=[-1, 2])],
        outputs=[TensorSpec(name="y", datatype="FP32", shape=[-1, 2])],
        files=[FileEntry(path="model.onnx", size=size, sha256="0" * 64)], max_batch_size=0,
    )


@pytest.fixture
def host():
    clock, loader = Clock(), FakeLoader()
    pool = ThreadPoolExecutor(2)
    mgr = ModelManager(repo=None, loader=loader, cache=DeviceCache(250), settings=HostdSettings(failed_backoff_s=1.0),
                       metrics=HostdMetrics(), exec_pool=pool, load_pool=pool, clock=clock)
    yield mgr, clock, loader
    pool.shutdown()


def _entry(mgr: ModelManager, model: str, size: int = 100) -> ModelEntry:
    m = _manifest(model, size)
    e = mgr.entries[m.key()] = ModelEntry(m, mgr.residency.life(m.key()))
    return e


async def _single_flight_two_waiters_one_load(mgr, clock, loader):
    e = _entry(mgr, "a")
    r1, r2 = await asyncio.gather(mgr.ready_runner(e), mgr.ready_runner(e))
    assert r1 is r2 and loader.calls == 1 and e.state is ModelState.READY
    assert (mgr.device_misses, mgr.device_hits) == (1, 2)
    assert type(r1.queue) is ModelQueue and mgr.cache.residents[e.key].size == 100
    assert type(r1._gate.core) is Dispatcher  # no host gate here: the runner's own, the same core class
    assert e.life is mgr.residency.life(e.key) and type(mgr.residency) is Residency
    await mgr.close()


async def _a_reload_is_told_what_the_last_load_measured(mgr, clock, loader):
    e = _entry(mgr, "a")
    await mgr.ready_runner(e)
    await mgr.unload(e)
    await mgr.ready_runner(e)
    # the first load knows nothing and is whole before it answers; the reload may defer work (prepacking)
    # because room for what the model took last time is already made
    assert loader.reserves == [0, 100] and e.memory_bytes == 100
    await mgr.close()


def test_a_reload_is_told_what_the_last_load_measured(host):
    asyncio.run(_a_reload_is_told_what_the_last_load_measured(*host))


async def _failed_load_backs_off_on_the_virtual_clock(mgr, clock, loader):
    e = _entry(mgr, "a")
    loader.fail = True
    with pytest.raises(Unavailable, match="corrupt weights") as first:
        await mgr.ready_runner(e)  # the model's own error, with its backoff: never a reason to call the host down
    assert first.value.reason == "load_failed" and first.value.retry_after_ms == 1000
    assert e.state is ModelState.FAILED and e.retry_at == clock.now + 1.0 and e.key not in mgr.cache
    clock.now += 0.5
    with pytest.raises(Unavailable) as err:
        await mgr.ready_runner(e)  # within the backoff: no new load
    assert err.value.reason == "load_failed" and loader.calls == 1
    clock.now += 0.5
    with pytest.raises(Unavailable) as again:
        await mgr.ready_runner(e)  # backoff passed: retried, failed again, now 2 s
    assert again.value.retry_after_ms == 2000
    assert loader.calls == 2 and e.retry_at == clock.now + 2.0
    loader.fail = False
    e.life.retry_now()  # what an explicit load (manager.load) does
    assert await mgr.ready_runner(e) is e.runner and e.failures == 0
    await mgr.close()


async def _no_room_leaves_the_model_absent_and_retry_is_allowed_at_once(mgr, clock, loader):
    big = _entry(mgr, "big", 200)
    await mgr.ready_runner(big)
    mgr.residency.pin(big.key, True)
    small = _entry(mgr, "small", 100)
    with pytest.raises(Unavailable) as err:
        await mgr.ready_runner(small)
    assert err.value.reason == "no_capacity" and small.state is ModelState.ABSENT and loader.calls == 1
    mgr.residency.pin(big.key, False)  # unpinned: the next request evicts big at once, no backoff
    await mgr.ready_runner(small)
    assert small.state is ModelState.READY and big.state is ModelState.ABSENT and mgr.cache.used == 100
    await mgr.close()


async def _busy_runner_is_never_evicted(mgr: ModelManager, loader: FakeLoader) -> None:
    release = threading.Event()
    loader.models["a"] = Blocking(release)
    a = _entry(mgr, "a", 200)
    runner = await mgr.ready_runner(a)
    call = asyncio.ensure_future(runner.infer(_req()))
    await asyncio.sleep(0.01)
    assert runner.busy and mgr.cache.residents[a.key].busy  # the runner told the core
    with pytest.raises(Unavailable):
        await mgr.ready_runner(_entry(mgr, "b", 100))
    release.set()
    await call
    assert not runner.busy and not mgr.cache.residents[a.key].busy
    await mgr.ready_runner(mgr.entries[("t", "b", "1")])  # now a can go
    assert a.state is ModelState.ABSENT
    await mgr.close()


class Blocking(Identity):
    def __init__(self, evt: threading.Event) -> None:
        self.evt = evt

    def run(self, inputs, outputs):
        self.evt.wait(5)
        return {"y": inputs["x"]}


def _req():
    x = np.zeros((1, 2), np.float32)
    return DecodedRequest(inputs={"x": x}, outputs=["y"], raw=True, rows=1, shape_key=(), nbytes=8)


class StorageDown(Unavailable):
    def __init__(self) -> None:
        super().__init__("model storage is unavailable", reason="storage_down")


async def _a_stalled_fetch_answers_its_waiters_storage_down(mgr, clock, loader):
    """Storage that hangs mid-fetch: every request waiting on the load is answered UNAVAILABLE storage_down
    once no byte has arrived for storage_stall_s (virtual seconds), long before its own deadline."""
    loader.stall = threading.Event()
    e = _entry(mgr, "a")
    waiters = [asyncio.ensure_future(mgr.ready_runner(e, deadline=clock.now + 60)) for _ in range(3)]
    await asyncio.sleep(0.05)
    assert not any(w.done() for w in waiters), "still within the stall bound"
    clock.now += mgr.settings.storage_stall_s + 0.1  # no bytes for longer than the bound
    done, _ = await asyncio.wait(waiters, timeout=5)
    assert len(done) == 3
    for w in waiters:
        err = w.exception()
        assert isinstance(err, Unavailable) and err.reason == "storage_down" and err.retry_after_ms
    assert loader.calls == 1, "one load for all waiters, still single-flight"
    loader.stall.set()  # the store's own timeout ends the fetch; the model is not left LOADING
    for _ in range(100):
        if e.load_task is None:
            break
        await asyncio.sleep(0.01)
    assert e.state is not ModelState.LOADING
    await mgr.close()


def test_stalled_storage(host):
    mgr = host[0]
    mgr.settings = mgr.settings.model_copy(update={"storage_stall_s": 0.2})
    asyncio.run(_a_stalled_fetch_answers_its_waiters_storage_down(*host))


def test_single_flight(host):
    asyncio.run(_single_flight_two_waiters_one_load(*host))


def test_failed_load_backoff(host):
    asyncio.run(_failed_load_backs_off_on_the_virtual_clock(*host))


def test_no_room(host):
    asyncio.run(_no_room_leaves_the_model_absent_and_retry_is_allowed_at_once(*host))


def test_busy_runner_is_never_evicted(host):
    asyncio.run(_busy_runner_is_never_evicted(host[0], host[2]))


def test_the_core_is_pure():
    """No event loop, no clock, no I/O: every hostd.core module imports only the standard library's data
    structures and other pure hostd modules."""
    import ast
    import pathlib

    import hostd.core

    allowed_hostd = {"hostd.core", "hostd.cache.policy", "hostd.batch_policy", "hostd.sched_policy"}
    for path in pathlib.Path(hostd.core.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for mod in mods:
                top = mod.split(".")[0]
                assert top in {"__future__", "collections", "dataclasses", "enum", "typing", "hostd"}, (path, mod)
                if top == "hostd":
                    assert any(mod == a or mod.startswith(a + ".") for a in allowed_hostd), (path, mod)
