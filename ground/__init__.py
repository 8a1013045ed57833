"""The ground floor: what every part of mmhost imports and what imports none of them.

- `wire`: everything two processes must agree on (metadata keys, the `mmhost-reason` trailer, the
  extension list, the heartbeat key schema)
- `errors` and `interceptors`: errors that carry their gRPC status, and the one place they become statuses
- `deadlines`: the one deadline rule that router admission, router forwarding and hostd share
- `manifest`, `versions`: the model manifest schema and pure version selection
- `settings`: every settings class, parsed once in an entry point and passed down
- `tenancy`, `units`, `params`, `serving`: tenant limits, byte sizes, v2 request parameters, run-until-signal

Layering (enforced by import-linter in `make test`): protos < ground < storage_adapters < catalog <
hostd | router < sim < mmhost (command line) < bench.
"""

__version__ = "0.1.0"
