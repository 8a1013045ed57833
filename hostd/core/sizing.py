"""How many batches run at once on a host (execution slots) and how many intra-op threads each runtime
session uses, so that running batches never oversubscribe the CPU: slots x threads <= cores.

Why: every running batch's intra-op threads compete for the cores. With 2 slots of 2 threads on 2 cores
(the old defaults: one slot per core, the runtime's default of one thread per core), two running batches
ask for 4 cores; a small model's batch then shares its core with a big batch's threads and with the event
loop, and its latency follows the big model's. Sized, each running batch has cores of its own.

On a GPU, batches run on the device and the CPU threads only feed it: slots default to 4 and threads to 1,
and each instance of a model runs its batches on a CUDA stream of its own (hostd/runtimes/torch_rt.py; an
ONNX Runtime session runs on its own stream, so different models overlap on the device).

Pure: the caller passes the core count.
"""

from __future__ import annotations

from dataclasses import dataclass

GPU_SLOTS = 4


@dataclass(frozen=True, slots=True)
class ExecutionPlan:
    slots: int  # batches running at once on the host
    threads: int  # intra-op threads per runtime session (ONNX Runtime and torch)
    note: str = ""  # why a setting was not taken as given (logged at start)

    @property
    def oversubscribed(self) -> bool:
        return bool(self.note)


def plan_execution(cores: int, device_kind: str = "cpu", slots: int = 0, threads: int = 0) -> ExecutionPlan:
    """`slots`, `threads`: the settings (0 = auto). CPU: auto slots = min(cores, 4) (cores // threads when
    threads are given): up to 4 batches at once, as on a GPU, and on a big host the cores go to each batch's
    threads rather than to more batches; auto threads = cores // slots; explicit threads that would
    oversubscribe the cores with the slots are lowered to cores // slots (at least 1)."""
    cores = max(1, cores)
    if device_kind == "cuda":
        return ExecutionPlan(slots or GPU_SLOTS, threads or 1)
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
