"""The host core: synchronous, clock-free bookkeeping that hostd's asyncio shell and sim/'s virtual-clock
shell both drive (plan, execute, commit). Nothing here imports asyncio, grpc, time, storage or metrics;
every method that needs the time takes `now`.

- device.py: the device cache (resident models, byte counters, eviction plans)
- lifecycle.py: one model version's states, single-flight loading, failure backoff
- residency.py: a host's lifecycles and its device cache, changed together
- queue.py: one model's pending requests and executors, over hostd.batch_policy.decide
- slots.py: the host's execution slots, granted fairly over hostd.sched_policy.FairShare (one kept for
  other models)
- sizing.py: how many slots and runtime threads (slots x threads <= cores on CPU)
- dispatch.py: a host's queues and slots together: which batches start now (returns a Step to execute)
- lru.py: a byte-bounded LRU (the host RAM tier's bookkeeping)
"""
