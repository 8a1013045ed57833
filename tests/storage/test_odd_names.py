"""Odd names and unusable stored content get clean answers from the local store and the repository layout:
a NUL byte or an over-long name is simply not there (never an OS error), a garbage policy.json is
ManifestInvalid (a StorageError, which serving answers UNAVAILABLE), never a raw parse error."""

from __future__ import annotations

import pytest

from catalog.repository import ManifestInvalid, ModelRepository
from storage_adapters.base import ObjectNotFound, StorageError
from storage_adapters.local import LocalStorage

ODD = ["a\0b", "x" * 256, "tenants/t/models/" + "m" * 300 + "/1/manifest.json", "ok/\0/manifest.json"]


@pytest.mark.parametrize("key", ODD)
def test_odd_keys_are_not_found_on_a_local_store(tmp_path, key):
    s = LocalStorage(tmp_path)
    with pytest.raises(ObjectNotFound):
        s.read_bytes(key)
    with pytest.raises(ObjectNotFound):
        s.stat(key)
    assert list(s.list(key)) == []
    assert s.list_dirs(key) == []


@pytest.mark.parametrize("name", ["a\0b", "m" * 300])
def test_odd_model_names_are_missing_models(tmp_path, name):
    repo = ModelRepository(LocalStorage(tmp_path))
    assert repo.versions("acme", name) == []
    assert repo.versions(name, "m") == []


def test_a_garbage_policy_file_is_invalid_content_not_a_crash(tmp_path):
    s = LocalStorage(tmp_path)
    s.put_bytes("tenants/acme/models/m/1/manifest.json", b"{}")
    s.put_bytes("tenants/acme/models/m/policy.json", b"\xff not json")
    repo = ModelRepository(s)
    with pytest.raises(ManifestInvalid) as e:
        repo.versions_and_policy("acme", "m")
    assert isinstance(e.value, StorageError)
    assert "policy" in str(e.value) and len(str(e.value)) < 400
