import json
from pathlib import Path

from typer.testing import CliRunner

from mmhost.cli import app

runner = CliRunner()


def test_sim_sweep_end_to_end(tmp_path):
    out = tmp_path / "out"
    res = runner.invoke(app, ["sim", "sweep", "--models", "80", "--requests", "4000", "--sizes", "0.05,0.1,0.3,0.6",
                              "--policy", "lru", "--policy", "gdsf", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "hit-rate curve" in res.output and "lru" in res.output and "gdsf" in res.output and "shed" in res.output
    assert (out / "mrc.png").read_bytes()[:4] == b"\x89PNG"
    assert len((out / "mrc.csv").read_text().splitlines()) == 1 + 8


def test_sim_run_from_config_file_and_trace(tmp_path):
    cfg = tmp_path / "sim.yaml"
    cfg.write_text("workload: {models: 60, requests: 3000, tenants: 2, seed: 4}\ncache_fraction: 0.2\n"
                   "policies: [lru, gdsf, offline]\n")
    res = runner.invoke(app, ["sim", "run", "--config", str(cfg), "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    assert "3,000 requests" in res.output and "per tenant" in res.output and "offline" in res.output
    saved = json.loads((tmp_path / "o" / "results.json").read_text())
    assert [r["policy"] for r in saved["results"]] == ["lru", "gdsf", "offline~"]
    assert saved["config"]["workload"]["models"] == 60

    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"ts": float(i), "tenant": "a", "model": f"m{i % 3}", "version": "1",
                                         "size_bytes": 100}) + "\n" for i in range(30)))
    res = runner.invoke(app, ["sim", "run", "--trace", str(trace), "--cache-bytes", "300", "-p", "lru",
                              "--mode", "full"])
    assert res.exit_code == 0, res.output
    assert "30 requests" in res.output and "p99" in res.output


def test_a_replay_that_sheds_most_requests_says_so_loudly(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("router starting\n" + "".join(
        json.dumps({"ts": float(i), "tenant": "a", "model": f"m{i % 2}", "version": "1", "status": "OK",
                    "size_bytes": 5_000_000 if i % 2 else 75_000}) + "\n" for i in range(40)))
    res = runner.invoke(app, ["sim", "run", "--trace", str(trace), "--cache-bytes", "1000000", "-p", "lru"],
                        env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "skipped: 1 not JSON (first at line 1)" in res.output
    assert "WARNING: lru sheds most requests (up to 50%) with a 1 MB cache: smaller than the largest model " \
           "(5 MB)" in res.output
    out = tmp_path / "o"
    res = runner.invoke(app, ["sim", "sweep", "--trace", str(trace), "--sizes", "0.1,0.5,1.0", "-p", "lru",
                              "--latency", "--out", str(out)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "shed 50%" in res.output and "WARNING: lru sheds most requests" in res.output
    assert (out / "p99.png").read_bytes()[:4] == b"\x89PNG"


def test_sim_rejects_bad_input():
    res = runner.invoke(app, ["sim", "run", "--policy", "fifo", "--requests", "10"])
    assert res.exit_code != 0 and "unknown policy" in res.output


def test_sim_run_replays_several_access_logs_given_as_repeated_traces(tmp_path):
    logs = []
    for n in range(2):  # a router's log and its worker's, 20 requests each
        f = tmp_path / f"access.jsonl{'.w1' if n else ''}"
        f.write_text("".join(json.dumps({"ts": float(2 * i + n), "tenant": "a", "model": f"m{i % 3}", "version": "1",
                                         "size_bytes": 100}) + "\n" for i in range(20)))
        logs += ["--trace", str(f)]
    res = runner.invoke(app, ["sim", "run", *logs, "--cache-bytes", "300", "-p", "lru"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "replayed 40 of 40 lines" in res.output and "40 requests" in res.output


def test_a_config_file_names_one_access_log_or_several(tmp_path):
    from sim.config import load_config

    one = tmp_path / "one.yaml"
    one.write_text("trace: a.jsonl\n")
    assert load_config(one, {}).trace == [Path("a.jsonl")]
    many = tmp_path / "many.yaml"
    many.write_text("trace: [a.jsonl, a.jsonl.w1]\n")
    assert load_config(many, {}).trace == [Path("a.jsonl"), Path("a.jsonl.w1")]
