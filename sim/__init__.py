"""sim/: a discrete-event simulator that drives hostd's real policies (hostd.cache.policy, hostd.batch_policy)
on a virtual clock. Entry points: cache_only.run_cache_only (fast path), cluster.run_cluster (full engine),
offline.run_offline (bound), mrc.sweep (miss-ratio curves); `mmhost sim` wraps them."""
