"""How many batches run at once on a host (execution slots) and how many intra-op threads each runtime
session uses, so that running batches never oversubscribe the CPU: slots x threads <= cores.

Why: every running batch's intra-op threads compete for the cores. With 2 slots of 2 threads on 2 cores
(the old defaults: one slot per core, the runtime's default of one thread per core), two running batches
ask for 4 cores; a small model's batch then shares its core with a big batch's threads and with the event
loop, and its latency follows the big model's. Sized, each running batch has cores of its own.

On a GPU, batches run on the device and the CPU threads only feed it: slots default to 4 and threads to 1,
and each instance of a model runs its batches on a CUDA stream of its own (hostd/runtimes/torch_rt.py; an
ONNX Runtime session runs on its own stream, so different models overlap on the device).

A lone batch may borrow the idle slots' cores (wide_lone_batches, on by default; issue #13: on 2 cores a
lone request runs on one thread, batch 1 of the 50 MB MLP in 1.6-1.9 ms against 1.3 ms on two). A session's
intra-op thread count is fixed when it is built and ONNX Runtime has no per-run setting, so an ONNX model on
CPU gets a second session of `wide` = cores threads over the same weights (hostd/runtimes/onnx.py), and the
dispatch (core/dispatch.py) runs a batch of one request on it when that batch is alone on the host and
estimated under WIDE_MAX_S; it holds every slot meanwhile, so the cores in use still never exceed `cores`,
and another model's work that arrives meanwhile waits for that one batch: at most WIDE_MAX_S. Measured on
2 cores, one run each: c1 p50 3.80 ms against 4.79 on a quiet box (load 0.4; a synchronous client). On the
box shared with other engineers' load, bench/batching.py (per-round medians) gave c1 1.52x the plain server
against 1.35x without it and c32 1.00x Triton's core against 1.09x (load 3-4), then c1 1.67x against 1.86x
and c32 0.97x the default's (load 2-4): a parallel section waits for its slowest thread, and with other load
one of the two often has no core. Measured again on a quiet host (load 1.1-1.8, only the bench running), two
bench/batching.py --variant runs: c1 p50 1.39x and 1.56x the plain server against 1.61x and 1.79x without it,
c32 1275 and 1113 req/s against 1164 and 1087; beside the noisy model (bench/noisy_model.py, two pairs) the
light model's p99 was no worse (25.6/32.4 against 70.1/82.0 ms, 20.3/23.1 against 24.5/30.9). So the setting
(wide_lone_batches) is on by default; the pure plan below takes `wide` as asked. Where such a batch runs (a
worker thread, or the event loop's own thread right after the loop was idle: ground/loopidle.py) and whether
its session prepacks (wide_prepacked) are the shell's business: docs/execution.md items 9 and 10.

Measured on 2 shared cores, one run each (bench/batching.py --variant, per-round medians; bench/noisy_model.py
--direct-only), and not adopted:
- one global ONNX Runtime pool of `cores` threads for every session (use_per_session_threads off): it holds
  cores - 1 workers and each running batch's calling thread computes too, so 2 slots run 3 threads on 2 cores,
  which this rule forbids. c1 p50 1.14-1.25x the plain server against 1.53-1.61x, but c32 0.91-1.04x the
  default's throughput with p99 1.19-1.60x Triton's against 1.07-1.08x;
- 1 slot x `cores` threads: within the rule. c1 1.13-1.39x, c32 0.92-1.03x the default's, p99 worse; and the
  kept slot is gone: a light model beside a noisy one waited a mean 4.8 ms for a slot (0.01 ms with 2 slots),
  light p50 15.5 ms against 2.3 ms, the noisy model kept 0.75x of its throughput.
At c32 the second core is not idle (the event loop and the clients need it) and a wide batch takes it: so
only lone batches of one request run wide.

Pure: the caller passes the core count.
"""

from __future__ import annotations

from dataclasses import dataclass

GPU_SLOTS = 4
WIDE_MAX_S = 0.005  # the longest estimated batch (seconds) that may run wide, holding every slot


@dataclass(frozen=True, slots=True)
class ExecutionPlan:
    slots: int  # batches running at once on the host
    threads: int  # intra-op threads per runtime session (ONNX Runtime and torch)
    note: str = ""  # why a setting was not taken as given (logged at start)
    wide: int = 0  # threads of a lone batch's session (every core; 0: none, no gain or not on CPU)

    @property
    def oversubscribed(self) -> bool:
        return bool(self.note)


def plan_execution(cores: int, device_kind: str = "cpu", slots: int = 0, threads: int = 0,
                   wide: bool = False) -> ExecutionPlan:
    """`slots`, `threads`: the settings (0 = auto). CPU: auto slots = min(cores, 4) (cores // threads when
    threads are given): up to 4 batches at once, as on a GPU, and on a big host the cores go to each batch's
    threads rather than to more batches; auto threads = cores // slots; explicit threads that would
    oversubscribe the cores with the slots are lowered to cores // slots (at least 1). `wide`: a lone batch
    may run on every core (the plan's `wide`, when that is more threads than a slot's)."""
    cores = max(1, cores)
    if device_kind == "cuda":
        return ExecutionPlan(slots or GPU_SLOTS, threads or 1)
    plan = _cpu_plan(cores, slots, threads)
    if wide and plan.slots >= 2 and plan.threads < cores and not plan.oversubscribed:
        return ExecutionPlan(plan.slots, plan.threads, plan.note, wide=cores)
    return plan


def _cpu_plan(cores: int, slots: int, threads: int) -> ExecutionPlan:
    if not slots:
        if threads:
            t = min(threads, cores)
            return ExecutionPlan(max(1, cores // t), t)
        slots = min(cores, GPU_SLOTS)
    fit = max(1, cores // slots)
    if not threads:
        return ExecutionPlan(slots, fit)
    if slots * threads <= cores:
        return ExecutionPlan(slots, threads)
    note = f"{slots} slots x {threads} threads > {cores} cores: {fit} thread(s) per session"
    if slots > cores:
        note += f"; {slots} slots still oversubscribe {cores} cores (execution_slots <= cores keeps batches apart)"
    return ExecutionPlan(slots, fit, note)
