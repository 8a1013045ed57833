"""S3Storage against a real moto_server process: the Storage contract, transfers, and failures."""

from __future__ import annotations

import hashlib
import os
import threading
import time

import pytest

from ground.settings import S3Settings
from storage_adapters.base import ObjectNotFound, StorageError, StorageUnavailable
from storage_adapters.factory import open_storage
from storage_adapters.s3 import S3Storage, parse_s3_uri
from tests.servers import MotoServer
from tests.storage.conftest import make_bucket

FAST_FAIL_S = 15.0  # generous bound: "seconds, not minutes"


def test_parse_uri():
    assert parse_s3_uri("s3://b") == ("b", "")
    assert parse_s3_uri("s3://b/") == ("b", "")
    assert parse_s3_uri("s3://b/a/c/") == ("b", "a/c/")
    with pytest.raises(ValueError):
        parse_s3_uri("s3:///x")


def test_factory_opens_s3(bucket, s3_settings):
    store = open_storage(f"s3://{bucket}/p", s3_settings)
    assert isinstance(store, S3Storage)
    assert bucket in store.description and s3_settings.endpoint_url in store.description


def test_basics(s3_store, tmp_path):
    s = s3_store
    assert list(s.list("")) == []
    assert s.list_dirs("tenants/") == []
    s.put_bytes("tenants/a/models/m/1/manifest.json", b"{}")
    s.put_bytes("tenants/a/models/m/2/model.onnx", b"x" * 10)
    s.put_bytes("tenants/b/models/n/1/manifest.json", b"{}")
    src = tmp_path / "f.bin"
    src.write_bytes(b"hello")
    s.upload_file(src, "tenants/a/models/m/1/model.onnx")

    assert s.list_dirs("tenants/") == ["a", "b"]
    assert s.list_dirs("tenants/a/models/m/") == ["1", "2"]
    assert sorted(o.key for o in s.list("tenants/a/")) == [
        "tenants/a/models/m/1/manifest.json",
        "tenants/a/models/m/1/model.onnx",
        "tenants/a/models/m/2/model.onnx",
    ]
    assert s.stat("tenants/a/models/m/2/model.onnx").size == 10
    assert s.read_bytes("tenants/a/models/m/1/model.onnx") == b"hello"
    dest = tmp_path / "out" / "m.onnx"
    s.download("tenants/a/models/m/1/model.onnx", dest)
    assert dest.read_bytes() == b"hello"

    # put_bytes replaces the object whole
    s.put_bytes("tenants/a/models/m/1/manifest.json", b'{"v": 2}')
    assert s.read_bytes("tenants/a/models/m/1/manifest.json") == b'{"v": 2}'

    s.delete("tenants/a/models/m/2/model.onnx")
    s.delete("tenants/a/models/m/2/model.onnx")  # absent: not an error
    assert not s.exists("tenants/a/models/m/2/model.onnx")
    assert s.exists("tenants/a/models/m/1/model.onnx")
    assert s.list_dirs("tenants/a/models/m/") == ["1"]


def test_prefix_isolates_stores(bucket, s3_settings):
    a = S3Storage.from_uri(f"s3://{bucket}/one", s3_settings)
    b = S3Storage.from_uri(f"s3://{bucket}/two/", s3_settings)
    a.put_bytes("k", b"a")
    assert not b.exists("k")
    assert [o.key for o in a.list("")] == ["k"]


def test_not_found(s3_store, tmp_path):
    for call in (
        lambda: s3_store.stat("nope"),
        lambda: s3_store.read_bytes("nope"),
        lambda: s3_store.download("nope", tmp_path / "x"),
    ):
        with pytest.raises(ObjectNotFound, match="nope"):
            call()
    assert not (tmp_path / "x").exists()


def _record_calls(store: S3Storage, op: str) -> list[tuple[int, dict]]:
    calls: list[tuple[int, dict]] = []
    lock = threading.Lock()

    def hook(params, **_):
        with lock:
            calls.append((threading.get_ident(), dict(params)))

    store.client.meta.events.register(f"provide-client-params.s3.{op}", hook)
    return calls


def test_large_object_multipart_upload_and_parallel_ranged_download(s3_store, s3_settings, tmp_path):
    size = 40 << 20
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(size))
    want = hashlib.sha256(src.read_bytes()).hexdigest()

    parts = _record_calls(s3_store, "UploadPart")
    sent: list[int] = []
    s3_store.upload_file(src, "big/model.bin", progress=sent.append)
    assert len(parts) == size // s3_settings.multipart_chunksize  # 8 parts of 5 MiB
    assert sum(sent) == size
    assert s3_store.stat("big/model.bin").size == size

    gets = _record_calls(s3_store, "GetObject")
    got: list[int] = []
    dest = tmp_path / "dl" / "big.bin"
    s3_store.download("big/model.bin", dest, progress=got.append)
    ranges = [p.get("Range") for _, p in gets]
    assert len(ranges) >= size // s3_settings.multipart_chunksize
    assert all(r and r.startswith("bytes=") for r in ranges), ranges
    assert len({tid for tid, _ in gets}) > 1, "ranged parts should be fetched by several worker threads"
    assert sum(got) == size
    assert hashlib.sha256(dest.read_bytes()).hexdigest() == want
    assert [p.name for p in dest.parent.iterdir()] == ["big.bin"]  # no temporary files left behind


def test_known_small_object_comes_down_in_one_get(s3_store, s3_settings, tmp_path):
    data = os.urandom(s3_settings.multipart_threshold - 1)
    src = tmp_path / "small.bin"
    src.write_bytes(data)
    s3_store.upload_file(src, "small/model.bin")
    gets = _record_calls(s3_store, "GetObject")
    heads = _record_calls(s3_store, "HeadObject")
    got: list[int] = []
    dest = tmp_path / "dl" / "small.bin"
    s3_store.download("small/model.bin", dest, progress=got.append, size_hint=len(data))
    assert len(gets) == 1 and "Range" not in gets[0][1] and not heads
    assert dest.read_bytes() == data and sum(got) == len(data)
    with pytest.raises(ObjectNotFound):
        s3_store.download("small/missing.bin", tmp_path / "dl" / "missing", size_hint=10)
    assert not (tmp_path / "dl" / "missing").exists()


def test_concurrent_use_from_threads(s3_store, tmp_path):
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            s3_store.put_bytes(f"th/{i}", str(i).encode())
            assert s3_store.read_bytes(f"th/{i}") == str(i).encode()
            s3_store.download(f"th/{i}", tmp_path / f"{i}.bin")
        except BaseException as e:  # noqa: BLE001 - collected and asserted below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(list(s3_store.list("th/"))) == 16


@pytest.fixture
def own_moto():
    """A moto_server of this test's own, which it may stop; stopped at teardown if still running."""
    srv = MotoServer()
    yield srv
    if srv.proc.poll() is None:
        srv.stop()


def _fails_fast_when_storage_stops(srv: MotoServer, transfer) -> None:
    """`transfer(progress)` stops `srv` on its first bytes: a StorageUnavailable naming the endpoint, fast."""
    stopped = threading.Event()

    def stop_on_first_bytes(_n: int) -> None:
        if not stopped.is_set():
            stopped.set()
            srv.stop()

    t0 = time.monotonic()
    with pytest.raises(StorageUnavailable) as ei:
        transfer(stop_on_first_bytes)
    assert time.monotonic() - t0 < FAST_FAIL_S
    assert stopped.is_set() and srv.endpoint in str(ei.value)


def test_storage_stopped_gives_fast_clear_errors(own_moto, tmp_path):
    srv = own_moto
    store = S3Storage.from_uri(f"s3://{make_bucket(srv.endpoint)}/p", S3Settings(endpoint_url=srv.endpoint))
    store.put_bytes("k", b"v")
    assert store.read_bytes("k") == b"v"
    srv.stop()
    src = tmp_path / "f"
    src.write_bytes(b"data")
    for name, call in [
        ("stat", lambda: store.stat("k")),
        ("read", lambda: store.read_bytes("k")),
        ("list", lambda: store.list_dirs("")),
        ("download", lambda: store.download("k", tmp_path / "d")),
        ("upload", lambda: store.upload_file(src, "k2")),
        ("put", lambda: store.put_bytes("k3", b"x")),
    ]:
        t0 = time.monotonic()
        with pytest.raises(StorageUnavailable) as ei:
            call()
        elapsed = time.monotonic() - t0
        assert elapsed < FAST_FAIL_S, f"{name} took {elapsed:.1f}s"
        assert srv.endpoint in str(ei.value), str(ei.value)
        assert "cannot reach storage" in str(ei.value)


def test_storage_stopped_during_a_download(own_moto, tmp_path):
    srv = own_moto
    settings = S3Settings(
        endpoint_url=srv.endpoint, multipart_threshold=5 << 20, multipart_chunksize=5 << 20, max_concurrency=2
    )
    store = S3Storage.from_uri(f"s3://{make_bucket(srv.endpoint)}/p", settings)
    src = tmp_path / "big"
    src.write_bytes(os.urandom(60 << 20))
    store.upload_file(src, "big")
    dest = tmp_path / "dl" / "big"
    _fails_fast_when_storage_stops(srv, lambda progress: store.download("big", dest, progress=progress))
    assert not dest.exists()  # never a partial file under the final name


def test_missing_bucket_is_a_clear_error(s3_server):
    store = S3Storage.from_uri("s3://no-such-bucket-here/p", S3Settings(endpoint_url=s3_server.endpoint))
    with pytest.raises(StorageUnavailable, match="bucket 'no-such-bucket-here' does not exist"):
        store.list_dirs("tenants/")
    with pytest.raises(StorageError, match="no-such-bucket-here"):
        store.put_bytes("k", b"v")


def test_wrong_credentials_are_a_clear_error(monkeypatch):
    monkeypatch.setenv("INITIAL_NO_AUTH_ACTION_COUNT", "0")  # this moto_server checks credentials
    srv = MotoServer()
    try:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAWRONGWRONGWRONG0")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
        store = S3Storage.from_uri("s3://any-bucket/p", S3Settings(endpoint_url=srv.endpoint))
        t0 = time.monotonic()
        for call in (lambda: store.list_dirs(""), lambda: store.stat("k"), lambda: store.put_bytes("k", b"v")):
            with pytest.raises(StorageUnavailable, match="credentials refused") as ei:
                call()
            assert srv.endpoint in str(ei.value)
        assert time.monotonic() - t0 < FAST_FAIL_S
    finally:
        srv.stop()


def test_no_credentials_is_a_clear_error(s3_server, monkeypatch, tmp_path):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    store = S3Storage.from_uri("s3://b/p", S3Settings(endpoint_url=s3_server.endpoint))
    with pytest.raises(StorageUnavailable, match="no usable AWS credentials"):
        store.stat("k")


def _read(store, key: str, size: int):
    """read_into a fresh buffer of `size`: (buffer, returned size, progress sum, ready ends)."""
    buf = bytearray(size)
    moved: list[int] = []
    ends: list[int] = []
    got = store.read_into(key, memoryview(buf), progress=moved.append, ready=ends.append)
    return buf, got, sum(moved), ends


def test_read_into_memory_in_one_get_in_place(s3_store, tmp_path):
    data = os.urandom((12 << 20) + 12345)  # above multipart_threshold, but the store is on this machine
    s3_store.put_bytes("m/one.bin", data)
    gets = _record_calls(s3_store, "GetObject")
    heads = _record_calls(s3_store, "HeadObject")
    buf, got, moved, ends = _read(s3_store, "m/one.bin", len(data))
    assert got == len(data) and bytes(buf) == data and moved == len(data)
    assert len(gets) == 1 and "Range" not in gets[0][1] and not heads
    assert ends == sorted(ends) and ends[-1] == len(data) and len(ends) > 1, "the prefix, as it arrives"

    # the manifest's size is wrong: the real size comes back, never more than the buffer is filled
    bigger, got, _, ends = _read(s3_store, "m/one.bin", len(data) + 10)
    assert got == len(data) and bytes(bigger[: len(data)]) == data and ends[-1] == len(data)
    smaller, got, moved, ends = _read(s3_store, "m/one.bin", 1000)
    assert got == len(data) and bytes(smaller) == data[:1000] and moved == 1000 and ends[-1] == 1000
    with pytest.raises(ObjectNotFound):
        _read(s3_store, "m/missing.bin", 10)


def test_read_into_memory_in_parallel_ranged_gets_where_configured(bucket, s3_settings):
    store = S3Storage.from_uri(f"s3://{bucket}/root", s3_settings.model_copy(update={"ranged_get_min_bytes": 5 << 20}))
    data = os.urandom((23 << 20) + 7)  # 5 parts of 5 MiB, the last short
    store.put_bytes("m/big.bin", data)
    gets = _record_calls(store, "GetObject")
    buf, got, moved, ends = _read(store, "m/big.bin", len(data))
    assert got == len(data) and bytes(buf) == data and moved == len(data)
    ranges = sorted(p["Range"] for _, p in gets)
    assert len(ranges) == 5 and ranges[0] == f"bytes=0-{(5 << 20) - 1}", ranges
    assert len({tid for tid, _ in gets}) > 1, "parts fetched by several threads"
    assert ends == sorted(ends) and ends[-1] == len(data), "ready follows the completed prefix, in order"
    assert all(e % (5 << 20) == 0 for e in ends[:-1])
    for wrong in (len(data) + 5, len(data) - (6 << 20)):  # a manifest that says more, or less
        _, got, _, _ = _read(store, "m/big.bin", wrong)
        assert got == len(data)


def test_ranged_reads_only_pay_off_across_a_network():
    from storage_adapters.s3 import ranged_get_min_bytes

    for local in ("http://127.0.0.1:9000", "http://localhost:9000", "http://[::1]:9000"):
        assert ranged_get_min_bytes(S3Settings(endpoint_url=local)) == 0
    assert ranged_get_min_bytes(S3Settings()) == S3Settings().multipart_threshold  # AWS
    assert ranged_get_min_bytes(S3Settings(endpoint_url="http://minio.storage:9000")) == 8 << 20
    assert ranged_get_min_bytes(S3Settings(endpoint_url="http://127.0.0.1:9000", ranged_get_min_bytes=1 << 30)) == 1 << 30


def test_storage_stopped_during_a_read_into_memory(own_moto):
    srv = own_moto
    store = S3Storage.from_uri(f"s3://{make_bucket(srv.endpoint)}/p", S3Settings(endpoint_url=srv.endpoint))
    data = os.urandom(60 << 20)
    store.put_bytes("big", data)
    buf = memoryview(bytearray(len(data)))
    _fails_fast_when_storage_stops(srv, lambda progress: store.read_into("big", buf, progress=progress))


def test_local_store_reads_into_memory(tmp_path):
    from storage_adapters.local import LocalStorage

    store = LocalStorage(tmp_path / "store")
    data = os.urandom((3 << 20) + 5)
    store.put_bytes("a/b.bin", data)
    buf, got, moved, ends = _read(store, "a/b.bin", len(data))
    assert got == len(data) and bytes(buf) == data and moved == len(data) and ends[-1] == len(data)
    _, got, _, _ = _read(store, "a/b.bin", 10)
    assert got == len(data)
    with pytest.raises(ObjectNotFound):
        _read(store, "a/none.bin", 10)
