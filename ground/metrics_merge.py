"""One /metrics port for a process and the helper processes it starts (the router and its Python-lane workers).

Each worker is a whole router with a registry of its own, serving it on a loopback port. The router's port
serves its own series and, read at each scrape, every worker's series with a label naming the worker
(`lane_worker="N"`), so one scrape target per pod sees all of them, whatever the number of workers, and sums
across them (`sum without (lane_worker)`) read as one router's. A worker that does not answer within the timeout
(restarting, stopped) is left out of that scrape and counted (`on_failure`); its series come back with it.

`merge_families` is the rule (pure: families in, families out); `MergedCollector` reads the workers over HTTP in
the scrape's own thread (ground/metrics_http.py), never on an event loop. Workers are read in OpenMetrics, which
round-trips a family exactly (a counter's `_total` and `_created` stay one family)."""

from __future__ import annotations

import logging
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable, Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.parser import text_string_to_metric_families

log = logging.getLogger(__name__)

OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
FETCH_TIMEOUT_S = 1.0
MAX_PARALLEL = 8  # sources read at once (fast_lane_workers is at most 32)


def merge_families(own: Iterable[Metric], others: Iterable[tuple[str, Iterable[Metric]]], label: str) -> list[Metric]:
    """`own` families as they are, then each other source's samples with `label` set to its name, in the family of
    the same name (a family is exposed once) or a new one. A source's family whose type differs from the own
    family of that name is left out (two types cannot share a name); so is a source sample that already has
    `label`."""
    merged: dict[str, Metric] = {}
    for f in own:
        m = Metric(f.name, f.documentation, f.type, f.unit)
        m.samples = list(f.samples)
        merged[f.name] = m
    for source, families in others:
        for f in families:
            have = merged.get(f.name)
            if have is None:
                have = merged[f.name] = Metric(f.name, f.documentation, f.type, f.unit)
            elif have.type != f.type:
                continue
            have.samples.extend(s._replace(labels={**s.labels, label: source}) for s in f.samples if label not in s.labels)
    return list(merged.values())


def fetch_families(url: str, timeout_s: float = FETCH_TIMEOUT_S) -> list[Metric]:
    """A /metrics endpoint's families, read in OpenMetrics. OSError or ValueError when it cannot be read."""
    req = urllib.request.Request(url, headers={"Accept": OPENMETRICS})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 - a loopback URL we built
        text = resp.read().decode("utf-8")
    return list(text_string_to_metric_families(text))


class MergedCollector:
    """A collector (`collect()` only) that yields `own`'s families merged with those read from `sources()` at each
    scrape: (label value, URL) pairs, read in parallel, each within `timeout_s`; a source whose URL is None (not
    serving now) is left out and counted by `on_failure` without a read."""

    def __init__(self, own: CollectorRegistry, sources: Callable[[], Sequence[tuple[str, str | None]]], label: str,
                 on_failure: Callable[[str], None] = lambda source: None, timeout_s: float = FETCH_TIMEOUT_S,
                 fetch: Callable[[str, float], list[Metric]] = fetch_families) -> None:
        self.own, self.sources, self.label = own, sources, label
        self.on_failure, self.timeout_s, self._fetch = on_failure, timeout_s, fetch

    def _read_one(self, source: str, url: str | None) -> tuple[str, list[Metric]] | None:
        if url is None:
            self.on_failure(source)
            return None
        try:
            return source, self._fetch(url, self.timeout_s)
        except (OSError, ValueError) as e:  # a worker restarting or stopped: left out of this scrape
            log.debug("metrics of %s=%s at %s not read: %s", self.label, source, url, e)
            self.on_failure(source)
            return None

    def _read(self) -> list[tuple[str, list[Metric]]]:
        """Every source, read at once (a stopped one costs the timeout, not the timeout per source), in order."""
        sources = list(self.sources())
        with ThreadPoolExecutor(max_workers=max(1, min(len(sources), MAX_PARALLEL)),
                                thread_name_prefix="metrics-merge") as ex:
            got = list(ex.map(lambda s: self._read_one(*s), sources))
        return [g for g in got if g is not None]

    def collect(self) -> Iterator[Metric]:
        others = self._read()  # before our own: a failure counted now is in this scrape's own series
        yield from merge_families(self.own.collect(), others, self.label)


def merged_registry(collector: MergedCollector) -> CollectorRegistry:
    """A registry that serves `collector` alone (no names registered, so no clash with the own registry's)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    return reg
