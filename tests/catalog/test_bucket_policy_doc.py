"""The bucket policies in docs/storage.md ("Who writes where") are valid JSON and say what the text claims: the
routers' credential writes model objects and nothing else (never a tenant record, never outside tenants/, no
delete), the hostds' only reads, and the keys an upload writes (ground.manifest's layout) are within the
routers' grant. S3 ARN wildcards are matched as S3 does: `*` spans '/'."""

from __future__ import annotations

import json
import re
from fnmatch import fnmatchcase
from pathlib import Path

from ground.manifest import MANIFEST_NAME, version_prefix

DOC = Path(__file__).resolve().parents[2] / "docs" / "storage.md"
BUCKET = "arn:aws:s3:::mmhost-models/"
STORE = "store/"


def _policies() -> list[dict]:
    text = DOC.read_text().split("## Who writes where", 1)[1].split("\n## ", 1)[0]
    return [json.loads(b) for b in re.findall(r"```json\n(.*?)```", text, re.S)]


def _allowed(policy: dict, action: str, key: str) -> bool:
    for st in policy["Statement"]:
        actions = [st["Action"]] if isinstance(st["Action"], str) else st["Action"]
        resources = [st["Resource"]] if isinstance(st["Resource"], str) else st["Resource"]
        if st["Effect"] == "Allow" and action in actions and any(fnmatchcase(BUCKET + key, r) for r in resources):
            return True
    return False


def test_the_three_policies_confine_each_credential():
    router, hostd, operator = _policies()
    model_file = STORE + version_prefix("acme", "mlp", "3") + "model.onnx"
    manifest = STORE + version_prefix("acme", "mlp", "3") + MANIFEST_NAME
    record = STORE + "tenants/acme/tenant.json"
    for key in (model_file, manifest):
        assert _allowed(router, "s3:PutObject", key) and _allowed(hostd, "s3:GetObject", key)
        assert not _allowed(hostd, "s3:PutObject", key)
    assert _allowed(router, "s3:GetObject", record)  # routers read tenant records while Redis is empty
    for key in (record, STORE + "tenants/acme/models.json", STORE + "elsewhere/x",
                "other-prefix/tenants/acme/models/m/1/model.onnx"):
        assert not _allowed(router, "s3:PutObject", key), key
    assert not _allowed(hostd, "s3:GetObject", record)
    for key in (model_file, record):
        assert not _allowed(router, "s3:DeleteObject", key) and not _allowed(hostd, "s3:DeleteObject", key)
        assert _allowed(operator, "s3:PutObject", key) and _allowed(operator, "s3:DeleteObject", key)
