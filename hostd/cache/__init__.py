"""hostd's tiered model cache. policy.py holds the pure eviction policies (also driven by sim/)."""
