"""Pure version selection: which stored version a request gets under a model's version policy."""

from __future__ import annotations

from collections.abc import Sequence

from ground.manifest import VersionPolicy, version_sort_key


class VersionNotFound(LookupError):
    pass


def latest(versions: Sequence[str]) -> str:
    if not versions:
        raise VersionNotFound("the model has no complete version")
    return max(versions, key=version_sort_key)


def resolve_version(versions: Sequence[str], policy: VersionPolicy, requested: str | None, u: float) -> str:
    """`requested` wins when given; else the policy decides. `u` is a uniform draw in [0, 1) for splits,
    passed in so the choice is reproducible in tests and the simulator."""
    if requested:
        if requested not in versions:
            raise VersionNotFound(f"version {requested!r} does not exist")
        return requested
    if policy.kind == "pinned":
        assert policy.version is not None
        if policy.version not in versions:
            raise VersionNotFound(f"pinned version {policy.version!r} does not exist")
        return policy.version
    if policy.kind == "split":
        live = [(v, w) for v, w in sorted(policy.weights.items(), key=lambda kv: version_sort_key(kv[0])) if v in versions and w > 0]
        if not live:
            return latest(versions)
        total = sum(w for _, w in live)
        acc = 0.0
        for v, w in live:
            acc += w / total
            if u < acc:
                return v
        return live[-1][0]
    return latest(versions)
