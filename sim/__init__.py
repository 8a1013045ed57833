"""sim/: a discrete-event simulator that drives hostd's real host core (hostd/core/: device cache, model
lifecycle, queues, execution slots, dispatch; over hostd.cache.policy, hostd.batch_policy and
hostd.sched_policy) on a virtual clock, adding only a cost model (costs.py) and the clock (engine.py).
Entry points: cache_only.run_cache_only (fast path), cluster.run_cluster (full engine), offline.run_offline
(bound), mrc.sweep (miss-ratio curves); `mmhost sim` wraps them."""
