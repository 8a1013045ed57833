"""hostd's load path on the virtual clock: the load thread pool and the loader's lock.

hostd runs every load, every unload's close and every RAM-tier fill on one thread pool (`load_workers`
threads; the rest wait in FIFO order), and a load's deserialize and warm-up hold the loader's lock (one at a
time per host: the memory probe around them must see that model alone). So a load is two stages: the first
(fetch and verify, or a copy from the RAM tier) on a worker, the second on the same worker under the lock.
A job that needs no lock (a close, a fill) is one stage.

Plan/commit, no clock: `submit(job)` and `done(job)` (the shell calls it when the job's current stage ends)
return a `Progress`: the jobs whose stage starts now (the shell schedules `done` after `job.stage_s`) and the
jobs that finished. Waits are kept per job (`pool_wait`, `lock_wait`) for the shell's statistics.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Stage(str, Enum):
    QUEUED = "queued"  # waiting for a worker
    FIRST = "first"  # on a worker, before the lock
    WAIT_LOCK = "wait_lock"
    LOCKED = "locked"
    DONE = "done"


@dataclass(eq=False)
class Job:
    kind: str  # what the shell does when it finishes: "load", "close", "fill"
    ref: Any  # the shell's handle (host, model, ...)
    first_s: float  # seconds on a worker before the lock (the whole job when locked_s is 0)
    locked_s: float = 0.0  # seconds under the loader's lock (0: the job never takes it)
    stage: Stage = Stage.QUEUED
    submitted: float = 0.0
    pool_wait: float = 0.0
    lock_wait: float = 0.0
    _mark: float = 0.0  # when the current wait began

    @property
    def stage_s(self) -> float:
        """Seconds of the stage that is running."""
        return self.locked_s if self.stage is Stage.LOCKED else self.first_s


@dataclass
class Progress:
    started: list[Job] = field(default_factory=list)  # a stage starts now: call `done` after job.stage_s
    finished: list[Job] = field(default_factory=list)


class LoadPool:
    def __init__(self, workers: int, lock: bool = True) -> None:
        """`workers`: hostd's load threads (0 or less: one). `lock`: loads serialize their locked stage."""
        self.workers = max(1, workers)
        self.idle = self.workers
        self.lock = lock
        self._queue: deque[Job] = deque()
        self._lock_queue: deque[Job] = deque()
        self._lock_held = False

    @property
    def queued(self) -> int:
        return len(self._queue)

    def submit(self, job: Job, now: float) -> Progress:
        job.submitted = job._mark = now
        job.stage = Stage.QUEUED
        self._queue.append(job)
        p = Progress()
        self._fill(now, p)
        return p

    def done(self, job: Job, now: float) -> Progress:
        """The job's running stage ended."""
        p = Progress()
        if job.stage is Stage.FIRST and job.locked_s > 0:
            if self.lock:
                job.stage, job._mark = Stage.WAIT_LOCK, now
                self._lock_queue.append(job)
            else:
                job.stage = Stage.LOCKED
                p.started.append(job)
        else:
            if job.stage is Stage.LOCKED and self.lock:
                self._lock_held = False
            job.stage = Stage.DONE
            self.idle += 1
            p.finished.append(job)
        self._grant_lock(now, p)
        self._fill(now, p)
        return p

    def _grant_lock(self, now: float, p: Progress) -> None:
        if self._lock_held or not self._lock_queue:
            return
        job = self._lock_queue.popleft()
        job.lock_wait = now - job._mark
        job.stage = Stage.LOCKED
        self._lock_held = True
        p.started.append(job)

    def _fill(self, now: float, p: Progress) -> None:
        while self.idle > 0 and self._queue:
            job = self._queue.popleft()
            self.idle -= 1
            job.pool_wait = now - job._mark
            job.stage = Stage.FIRST
            p.started.append(job)
