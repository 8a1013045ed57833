"""Fuzz every RPC of the v2 inference service with random and mutated bodies, sent as raw bytes: bit flips,
truncations, random bytes, and valid messages with absurd field values (huge names, NUL bytes, negative and
huge shapes, wrong datatypes, parameters of the wrong kind). Seeded, so a run repeats exactly.

What must hold (tests/isolation/test_fuzz.py checks it with a few hundred bodies per RPC; this script runs
the long version): no UNKNOWN and no INTERNAL answer, every error carries `mmhost-reason` (an mmhost process
answered, not the transport), every message is bounded, every process is alive afterwards.

    python -m bench.fuzz --target 127.0.0.1:8101 --tenant-header demo      # a hostd directly
    python -m bench.fuzz --target 127.0.0.1:8000 --key KEY --model mlp     # through a router
prints, per RPC, the count of each status code."""

from __future__ import annotations

import random
import struct
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import grpc

from ground.wire import REASON, SERVICE
from protos import grpc_service_pb2 as pb

RPCS = ("ServerLive", "ServerReady", "ServerMetadata", "ModelReady", "ModelMetadata", "ModelConfig", "ModelInfer",
        "ModelStatistics", "RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload")
FORBIDDEN = frozenset({"UNKNOWN", "INTERNAL"})
MAX_MESSAGE = 1100  # ground.errors.MAX_MESSAGE_CHARS plus slack


def _absurd_names(rng: random.Random, model: str) -> list[str]:
    return [model, "", "x" * rng.choice((129, 4096, 20_000)), f"{model}\x00evil", "../../etc/passwd", "é" * 50,
            model + "/" + model, " ", "..", ".", "a" * 128, "\ud7ff" * 3, f"{model}.{rng.randrange(10**9)}"]


def _params(rng: random.Random, m) -> None:
    """Random parameters of every kind, right or wrong, on a message's `parameters` map."""
    for _ in range(rng.randrange(4)):
        key = rng.choice(("timeout", "priority", "version", "pin", "binary_data_output", "x" * 300, "sequence_id"))
        p = m.parameters[key]
        kind = rng.randrange(5)
        if kind >= 3 and "double_param" not in p.DESCRIPTOR.fields_by_name:  # a repository parameter
            p.bytes_param = rng.choice((b"", b"\xff" * 100))
        elif kind == 0:
            p.int64_param = rng.choice((-1, 0, 1, 2**63 - 1, -(2**63), 10**12))
        elif kind == 1:
            p.string_param = rng.choice(("", "1", "abc", "\x00", "9" * 500))
        elif kind == 2:
            p.bool_param = rng.random() < 0.5
        elif kind == 3:
            p.double_param = rng.choice((float("nan"), float("inf"), -1.0, 1e300))
        else:
            p.uint64_param = rng.choice((0, 2**64 - 1))


def _tensor(rng: random.Random, in_dim: int) -> tuple[pb.ModelInferRequest.InferInputTensor, bytes | None]:
    dtypes = ("FP32", "FP32", "FP16", "INT64", "BYTES", "BOOL", "", "fp32", "COMPLEX", "FP32\x00")
    shape = rng.choice(([1, in_dim], [2, in_dim], [-1, in_dim], [0, in_dim], [2**62, in_dim], [1], [],
                        [1, in_dim, 1], [10**6, 10**6], [1, -in_dim]))
    t = pb.ModelInferRequest.InferInputTensor(name=rng.choice(("input", "input", "", "nope", "input\x00")),
                                              datatype=rng.choice(dtypes), shape=shape)
    raw = None
    choice = rng.randrange(4)
    if choice == 0:
        raw = bytes(rng.getrandbits(8) for _ in range(rng.choice((0, 3, 4 * in_dim, 8 * in_dim, 4 * in_dim + 1))))
    elif choice == 1:
        t.contents.fp32_contents.extend(rng.random() for _ in range(rng.choice((0, in_dim, in_dim + 1))))
    elif choice == 2:
        t.contents.bytes_contents.extend([b"\xff\xfe", b"abc"][: rng.randrange(3)])
        t.contents.int64_contents.extend([1, -1][: rng.randrange(3)])
    else:
        raw = struct.pack(f"<{in_dim}f", *([1.0] * in_dim))
    return t, raw


def valid_messages(rpc: str, rng: random.Random, model: str, in_dim: int) -> list:
    """Well-formed messages for `rpc` (some sensible, most absurd)."""
    names = _absurd_names(rng, model)
    name = rng.choice(names)
    version = rng.choice(("", "", "1", "2", "-1", "x" * 300, "\x00"))
    if rpc == "ServerLive":
        return [pb.ServerLiveRequest()]
    if rpc == "ServerReady":
        return [pb.ServerReadyRequest()]
    if rpc == "ServerMetadata":
        return [pb.ServerMetadataRequest()]
    if rpc == "ModelReady":
        return [pb.ModelReadyRequest(name=name, version=version)]
    if rpc == "ModelMetadata":
        return [pb.ModelMetadataRequest(name=name, version=version)]
    if rpc == "ModelConfig":
        return [pb.ModelConfigRequest(name=name, version=version)]
    if rpc == "ModelStatistics":
        return [pb.ModelStatisticsRequest(name=rng.choice((name, "")), version=version)]
    if rpc == "RepositoryIndex":
        return [pb.RepositoryIndexRequest(repository_name=rng.choice(("", "x" * 1000)), ready=rng.random() < 0.5)]
    if rpc == "RepositoryModelLoad":
        m = pb.RepositoryModelLoadRequest(model_name=name, repository_name=rng.choice(("", "r")))
        _params(rng, m)
        return [m]
    if rpc == "RepositoryModelUnload":
        m = pb.RepositoryModelUnloadRequest(model_name=name)
        _params(rng, m)
        return [m]
    assert rpc == "ModelInfer"
    r = pb.ModelInferRequest(model_name=name if rng.random() < 0.5 else model, model_version=version,
                             id=rng.choice(("", "id", "\x00" * 10, "i" * 5000)))
    raws: list[bytes] = []
    for _ in range(rng.choice((0, 1, 1, 1, 2))):
        t, raw = _tensor(rng, in_dim)
        r.inputs.append(t)
        if raw is not None:
            raws.append(raw)
    if raws and rng.random() < 0.9:
        r.raw_input_contents.extend(raws)
    for _ in range(rng.randrange(3)):
        o = r.outputs.add()
        o.name = rng.choice(("output", "nope", "", "output"))
        if rng.random() < 0.3:
            o.parameters["binary_data"].bool_param = True
    _params(rng, r)
    return [r]


def mutate(rng: random.Random, body: bytes) -> bytes:
    """A bit flip, truncation, random insertion, duplication or plain random bytes."""
    kind = rng.randrange(6)
    if kind == 0 and body:
        b = bytearray(body)
        for _ in range(rng.randrange(1, 4)):
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        return bytes(b)
    if kind == 1 and body:
        return body[: rng.randrange(len(body))]
    if kind == 2:
        i = rng.randrange(len(body) + 1)
        return body[:i] + bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 16))) + body[i:]
    if kind == 3:
        return body + body[: rng.randrange(len(body) + 1)]
    if kind == 4:  # a field with a huge declared length, a varint that never ends, an unknown wire type
        return body + rng.choice((b"\x0a\xff\xff\xff\xff\x0f", b"\x08" + b"\xff" * 11, b"\x0f", b"\x0b\x0c", b"\x0c"))
    return bytes(rng.getrandbits(8) for _ in range(rng.choice((0, 1, 7, 64, 512))))


def bodies(rpc: str, n: int, seed: int, model: str, in_dim: int) -> Iterator[bytes]:
    """`n` bodies for `rpc`: a third well-formed (absurd values), two thirds mutated or random."""
    rng = random.Random(f"{seed}:{rpc}")
    for i in range(n):
        body = rng.choice(valid_messages(rpc, rng, model, in_dim)).SerializeToString()
        yield body if i % 3 == 0 else mutate(rng, body)


@dataclass
class Tally:
    codes: dict[str, Counter] = field(default_factory=dict)  # rpc -> status name -> count
    bad: list[str] = field(default_factory=list)  # first few answers that break the rules

    def add(self, rpc: str, code: str, problem: str = "") -> None:
        self.codes.setdefault(rpc, Counter())[code] += 1
        if problem and len(self.bad) < 20:
            self.bad.append(f"{rpc}: {problem}")

    def count(self, code: str) -> int:
        return sum(c[code] for c in self.codes.values())


def check(rpc: str, err: grpc.RpcError | None, tally: Tally) -> None:
    if err is None:
        tally.add(rpc, "OK")
        return
    code = err.code().name
    md = dict(err.trailing_metadata() or ())
    text = err.details() or ""
    problem = ""
    if code in FORBIDDEN:
        problem = f"{code}: {text[:200]}"
    elif REASON not in md:
        problem = f"{code} without {REASON} (not answered by mmhost): {text[:200]}"
    elif len(text) > MAX_MESSAGE:
        problem = f"{code}: message of {len(text)} characters"
    tally.add(rpc, code, problem)


def fuzz(channel: grpc.Channel, metadata: tuple[tuple[str, str], ...], n: int, seed: int, model: str,
         in_dim: int, rpcs: tuple[str, ...] = RPCS, timeout: float = 20.0,
         progress: Callable[[str, Counter], None] | None = None) -> Tally:
    tally = Tally()
    for rpc in rpcs:
        call = channel.unary_unary(f"/{SERVICE}/{rpc}")  # bytes in, bytes out
        for body in bodies(rpc, n, seed, model, in_dim):
            try:
                call(body, metadata=metadata, timeout=timeout)
                check(rpc, None, tally)
            except grpc.RpcError as e:
                check(rpc, e, tally)
        if progress is not None:
            progress(rpc, tally.codes.get(rpc, Counter()))
    return tally


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True, help="host:port of a hostd or router")
    ap.add_argument("--key", help="API key (router)")
    ap.add_argument("--tenant-header", help="mmhost-tenant metadata (hostd)")
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--in-dim", type=int, default=64)
    ap.add_argument("-n", type=int, default=10_000, help="bodies per RPC")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    md: tuple[tuple[str, str], ...] = ()
    if a.key:
        md += (("authorization", f"Bearer {a.key}"),)
    if a.tenant_header:
        md += (("mmhost-tenant", a.tenant_header),)
    opts = [("grpc.max_send_message_length", 256 << 20), ("grpc.max_receive_message_length", 256 << 20)]
    with grpc.insecure_channel(a.target, options=opts) as ch:
        tally = fuzz(ch, md, a.n, a.seed, a.model, a.in_dim,
                     progress=lambda rpc, c: print(f"{rpc:24s} " + "  ".join(f"{k} {v}" for k, v in sorted(c.items())),
                                                   flush=True))
    print(f"UNKNOWN {tally.count('UNKNOWN')}  INTERNAL {tally.count('INTERNAL')}  rule breaks {len(tally.bad)}")
    for b in tally.bad:
        print("  " + b)
    raise SystemExit(1 if tally.bad else 0)


if __name__ == "__main__":
    main()
