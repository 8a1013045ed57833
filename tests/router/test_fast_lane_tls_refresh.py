"""FastLane.refresh_tls's rules, with HAProxy's runtime API answered by the test (the real HAProxy's side is
tests/router/test_tls.py's rotation test): nothing is sent while the files stay as they are; a rotated pair goes
as one blank-line-free payload; a refusal raises, leaves the file a restarted HAProxy reads as it was, and the
same files are sent again at the next refresh until HAProxy takes them; a rotation caught half-way (a key that
matches no certificate) sends nothing."""

from __future__ import annotations

import asyncio

import pytest

from mmhost import certs
from router.fastlane import FastLane, FastLaneError
from tests.pki import make_pki


@pytest.fixture
def lane(tmp_path):
    pki = make_pki(tmp_path / "pki")
    fl = FastLane(listen="127.0.0.1:1", router="127.0.0.1:2", listen_tls=(str(pki / "router.pem"),
                  str(pki / "router-key.pem")), on_records=lambda recs: None)
    sent: list[str] = []
    answers: list[str] = []

    async def command(line: str) -> str:
        sent.append(line)
        return answers.pop(0) if answers else "Success!"

    fl.command = command  # type: ignore[method-assign]
    yield fl, pki, sent, answers
    asyncio.run(fl.stop())


def test_a_rotated_pair_is_sent_once_and_a_refusal_is_sent_again(lane):
    fl, pki, sent, answers = lane
    assert asyncio.run(fl.refresh_tls()) == [] and sent == []  # unchanged files: nothing to send
    new = certs.issue(certs.load_ca(pki), "mmhost-router", hosts=["127.0.0.1"], server=True, days=2)
    certs.write_pair(pki, "router", new)
    before = (fl.dir / "listen.pem").read_text()
    answers += ["No ongoing transaction!", "Transaction created", "Can't commit: error"]  # abort, set, commit
    with pytest.raises(FastLaneError, match="did not take"):
        asyncio.run(fl.refresh_tls())
    assert (fl.dir / "listen.pem").read_text() == before  # a restarted HAProxy starts with what it took
    pem = str(fl.dir / "listen.pem")
    assert asyncio.run(fl.refresh_tls()) == [pem]  # the files did not change again: sent again, and taken
    assert asyncio.run(fl.refresh_tls()) == []
    assert sent[-3:-2] == [f"abort ssl cert {pem}"]  # no transaction a failed commit left open is committed
    payload = sent[-2]
    assert payload.startswith(f"set ssl cert {pem} <<\n") and sent[-1] == f"commit ssl cert {pem}"
    body = payload.split("<<\n", 1)[1]
    assert "\n\n" not in body.rstrip("\n") and "BEGIN CERTIFICATE" in body and "PRIVATE KEY" in body
    assert (fl.dir / "listen.pem").read_text().strip() == body.strip()  # what a restarted HAProxy would read


def test_a_half_written_rotation_sends_nothing_until_it_is_whole(lane):
    fl, pki, sent, _ = lane
    other = certs.issue(certs.load_ca(pki), "mmhost-router", hosts=["127.0.0.1"], server=True, days=2)
    (pki / "router-key.pem").write_bytes(certs.key_pem(other.key))  # the key of a certificate not yet written
    assert asyncio.run(fl.refresh_tls()) == [] and sent == []
    certs.write_pair(pki, "router", other)
    assert asyncio.run(fl.refresh_tls()) == [str(fl.dir / "listen.pem")]
