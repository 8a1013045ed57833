"""One model version known to this host: its manifest, its lifecycle (hostd/core/lifecycle.py), and while
resident the loaded model, its runner and its measured memory. The model manager owns the entries; the
servicer, the control service and stats read them."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from ground.manifest import ModelManifest
from hostd.batcher import ModelRunner
from hostd.loader import LoadProgress
from hostd.core.lifecycle import Lifecycle, ModelState
from hostd.runtimes.base import LoadedModel
from hostd.stats import ModelStats

Key = tuple[str, str, str]  # (tenant, model, version)


@dataclass
class ModelEntry:
    manifest: ModelManifest
    life: Lifecycle = field(default_factory=Lifecycle)
    stats: ModelStats = field(default_factory=ModelStats)
    runner: ModelRunner | None = None
    loaded: LoadedModel | None = None
    load_task: asyncio.Task | None = None
    load_progress: LoadProgress | None = None  # the load under way: phase and when bytes last arrived
    unload_task: asyncio.Task | None = None
    memory_bytes: int = 0
    last_memory_bytes: int = 0  # measured at the previous load: the estimate for the next one
    load_cost_s: float = 0.0
    last_used: float = 0.0
    hits: int = 0

    @property
    def key(self) -> Key:
        return self.manifest.key()

    @property
    def state(self) -> ModelState:
        return self.life.state

    @property
    def error(self) -> str:
        return self.life.error

    @property
    def failures(self) -> int:
        return self.life.failures

    @property
    def retry_at(self) -> float:
        return self.life.retry_at

    @property
    def pinned(self) -> bool:
        """Set through the manager (`load(..., pin=)`), which tells the device cache too."""
        return self.life.pinned

    @property
    def busy(self) -> bool:
        return self.runner is not None and self.runner.busy
