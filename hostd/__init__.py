"""The host daemon: one per GPU. Loads models lazily, batches requests, runs them."""
