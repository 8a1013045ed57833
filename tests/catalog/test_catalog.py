"""The catalog over S3 (moto_server) and its Redis index (a real redis-server): storage is the truth,
Redis can be flushed and rebuilt, policies resolve, half-written versions stay invisible."""

from __future__ import annotations

import time
import uuid

import pytest

from catalog.index import CatalogUnavailable, RedisCatalog, StorageCatalog, connect_redis
from ground.manifest import ModelFormat, ModelManifest, TensorSpec, VersionPolicy, version_prefix
from ground.settings import S3Settings
from storage_adapters.factory import open_storage
from catalog.publish import publish_version
from catalog.repository import ModelNotFound, ModelRepository
from tests.servers import RedisServer


@pytest.fixture
def repo(s3_uri, s3_server) -> ModelRepository:
    return ModelRepository(open_storage(s3_uri, S3Settings(endpoint_url=s3_server.endpoint)))


@pytest.fixture
def prefix() -> str:
    return f"test:{uuid.uuid4().hex[:8]}:"


@pytest.fixture
def rcat(redis_server, repo, prefix) -> RedisCatalog:
    return RedisCatalog(connect_redis(redis_server.url), repo, prefix=prefix)


def put_version(repo: ModelRepository, tenant: str, model: str, version: str, demo_files) -> ModelManifest:
    """Publish a version directly (the CLI path is tested in test_upload_cli; this keeps setup cheap)."""
    m = ModelManifest(
        tenant=tenant, model=model, version=version, format=ModelFormat.ONNX, model_file="model.onnx",
        inputs=[TensorSpec(name="input", datatype="FP32", shape=[-1, 64])],
        outputs=[TensorSpec(name="output", datatype="FP32", shape=[-1, 10])],
        max_batch_size=32,
    )
    return publish_version(repo, m, {"model.onnx": demo_files / "mlp.onnx"})


def snapshot(cat) -> dict:
    """Everything a router can ask the catalog."""
    out = {}
    for t, m, vs, pol in cat.entries():
        out[(t, m)] = (vs, pol, [cat.manifest(t, m, v) for v in vs], cat.resolve(t, m, u=0.0).version)
    return out


def test_storage_and_redis_catalogs_agree_and_rebuild_restores_after_flushall(repo, demo_files, tmp_path, cli, s3_uri):
    redis = RedisServer(tmp_path)  # our own server: this test runs FLUSHALL
    try:
        for t, m, v in [("acme", "a", "1"), ("acme", "a", "2"), ("acme", "b", "1"), ("beta", "a", "1"), ("beta", "c", "3")]:
            put_version(repo, t, m, v, demo_files)
        repo.set_policy("acme", "a", VersionPolicy(kind="pinned", version="1"))
        storage_cat = StorageCatalog(repo)
        want = snapshot(storage_cat)
        assert len(want) == 4 and want[("acme", "a")][3] == "1"

        r = cli("catalog", "rebuild", "--store", s3_uri, "--redis", redis.url)
        assert r.exit_code == 0, r.output
        assert "indexed 5 version(s) of 4 model(s) for 2 tenant(s)" in r.stdout
        rcat = RedisCatalog(connect_redis(redis.url), repo)
        assert rcat.ready()
        assert snapshot(rcat) == want

        connect_redis(redis.url).flushall()
        assert not rcat.ready()
        assert snapshot(rcat) == want  # documented: an unbuilt index reads through to storage

        r = cli("catalog", "rebuild", "--store", s3_uri, "--redis", redis.url)
        assert r.exit_code == 0, r.output
        assert rcat.ready()
        assert snapshot(rcat) == want
        # served from Redis now: a model that reaches storage without being indexed stays unseen until indexed
        put_version(repo, "gamma", "z", "1", demo_files)
        with pytest.raises(ModelNotFound):
            rcat.resolve("gamma", "z")
        r = cli("catalog", "list", "--store", s3_uri, "--redis", redis.url)
        assert r.exit_code == 0 and "gamma" not in r.stdout and "beta" in r.stdout
        cli("catalog", "rebuild", "--store", s3_uri, "--redis", redis.url)
        assert rcat.resolve("gamma", "z").version == "1"
    finally:
        redis.stop()


def test_rebuild_drops_what_storage_no_longer_has(rcat, repo, demo_files):
    put_version(repo, "acme", "a", "1", demo_files)
    put_version(repo, "acme", "a", "2", demo_files)
    put_version(repo, "acme", "gone", "1", demo_files)
    rcat.index_policy("acme", "a", VersionPolicy(kind="pinned", version="1"))  # index only: storage says latest
    rcat.rebuild()
    assert rcat.resolve("acme", "a").version == "2"
    assert rcat.models("acme") == ["a", "gone"]
    repo.storage.delete(version_prefix("acme", "gone", "1") + "manifest.json")
    repo.storage.delete(version_prefix("acme", "a", "2") + "manifest.json")
    report = rcat.rebuild()
    assert report.versions == 1 and report.pruned >= 2
    assert rcat.models("acme") == ["a"]
    assert rcat.versions("acme", "a") == ["1"]
    with pytest.raises(ModelNotFound):
        rcat.resolve("acme", "gone")


def test_second_upload_is_picked_up_by_latest(cli, s3_uri, repo, redis_server, prefix, demo_files):
    args = ["--store", s3_uri, "--tenant", "acme", "--model", "mlp", "--redis", redis_server.url, "--redis-prefix", prefix]
    assert cli("upload", *args, demo_files / "mlp.onnx").stdout.strip() == "1"
    rcat = RedisCatalog(connect_redis(redis_server.url), repo, prefix=prefix)
    rcat.rebuild()
    assert rcat.resolve("acme", "mlp").version == "1"
    r = cli("upload", *args, demo_files / "mlp2.onnx")
    assert r.exit_code == 0 and r.stdout.strip() == "2"
    for cat in (rcat, StorageCatalog(repo)):
        m = cat.resolve("acme", "mlp")
        assert m.version == "2"
        assert m.files[0].sha256 != cat.manifest("acme", "mlp", "1").files[0].sha256
        assert cat.resolve("acme", "mlp", version="1").version == "1"


def test_pinned_and_split_policies(cli, s3_uri, repo, redis_server, prefix, demo_files):
    base = ["--store", s3_uri, "--tenant", "acme", "--model", "mlp", "--redis", redis_server.url, "--redis-prefix", prefix]
    for _ in range(3):
        assert cli("upload", *base, demo_files / "mlp.onnx").exit_code == 0
    rcat = RedisCatalog(connect_redis(redis_server.url), repo, prefix=prefix)
    rcat.rebuild()
    cats = (rcat, StorageCatalog(repo))

    r = cli("catalog", "set-policy", *base, "pinned", "2")
    assert r.exit_code == 0, r.output
    for cat in cats:
        assert {cat.resolve("acme", "mlp", u=u).version for u in (0.0, 0.5, 0.99)} == {"2"}
        assert cat.resolve("acme", "mlp", version="3").version == "3"  # an explicit version wins

    r = cli("catalog", "set-policy", *base, "split", "1=0.9,3=0.1")
    assert r.exit_code == 0, r.output
    for cat in cats:
        assert cat.policy("acme", "mlp").kind == "split"
        assert cat.resolve("acme", "mlp", u=0.0).version == "1"
        assert cat.resolve("acme", "mlp", u=0.89).version == "1"
        assert cat.resolve("acme", "mlp", u=0.95).version == "3"
        picks = [cat.resolve("acme", "mlp", u=(i + 0.5) / 50).version for i in range(50)]
        assert picks.count("3") == 5 and picks.count("1") == 45

    assert cli("catalog", "set-policy", *base, "latest").exit_code == 0
    for cat in cats:
        assert cat.resolve("acme", "mlp", u=0.0).version == "3"

    r = cli("catalog", "set-policy", *base, "pinned", "9")
    assert r.exit_code == 1 and "no version 9" in r.output
    r = cli("catalog", "set-policy", *base, "split", "1=x")
    assert r.exit_code != 0
    # policies survive a rebuild because they live in storage
    assert cli("catalog", "set-policy", *base, "pinned", "1").exit_code == 0
    rcat.rebuild()
    assert rcat.resolve("acme", "mlp").version == "1"


def test_half_written_version_is_invisible(cli, s3_uri, repo, rcat, demo_files):
    assert cli("upload", "--store", s3_uri, "--tenant", "acme", "--model", "mlp", demo_files / "mlp.onnx").exit_code == 0
    # an upload that died after the files and before the manifest
    repo.storage.upload_file(demo_files / "mlp2.onnx", version_prefix("acme", "mlp", "2") + "model.onnx")
    report = rcat.rebuild()
    assert report.versions == 1
    for cat in (rcat, StorageCatalog(repo)):
        assert cat.versions("acme", "mlp") == ["1"]
        assert cat.resolve("acme", "mlp").version == "1"
        with pytest.raises(ModelNotFound):
            cat.resolve("acme", "mlp", version="2")
    # the next upload never reuses the half-written folder
    r = cli("upload", "--store", s3_uri, "--tenant", "acme", "--model", "mlp", demo_files / "mlp2.onnx")
    assert r.stdout.strip() == "3"


def test_unknown_names_are_not_found(rcat, repo, demo_files):
    put_version(repo, "acme", "a", "1", demo_files)
    rcat.rebuild()
    for cat in (rcat, StorageCatalog(repo)):
        for t, m, v in [("acme", "nope", None), ("other", "a", None), ("acme", "a", "5")]:
            with pytest.raises(ModelNotFound):
                cat.resolve(t, m, v)


def test_prefixes_isolate_indexes(redis_server, repo, demo_files):
    put_version(repo, "acme", "a", "1", demo_files)
    one = RedisCatalog(connect_redis(redis_server.url), repo, prefix=f"iso1:{uuid.uuid4().hex[:6]}:")
    two = RedisCatalog(connect_redis(redis_server.url), repo, prefix=f"iso2:{uuid.uuid4().hex[:6]}:")
    one.rebuild()
    assert one.ready() and not two.ready()


def test_redis_down_is_a_fast_clear_error(repo, demo_files, tmp_path, cli, s3_uri):
    redis = RedisServer(tmp_path)
    put_version(repo, "acme", "a", "1", demo_files)
    rcat = RedisCatalog(connect_redis(redis.url), repo)
    rcat.rebuild()
    redis.stop()
    t0 = time.monotonic()
    with pytest.raises(CatalogUnavailable) as ei:
        rcat.resolve("acme", "a")
    assert time.monotonic() - t0 < 10
    assert f"127.0.0.1:{redis.port}" in str(ei.value)
    r = cli("catalog", "rebuild", "--store", s3_uri, "--redis", redis.url)
    assert r.exit_code == 1 and f"127.0.0.1:{redis.port}" in r.output and "unreachable" in r.output
