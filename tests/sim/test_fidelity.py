"""The fidelity machinery on a real hostd (the bench, bench/sim_fidelity.py, is the whole check): scrapes of
its metrics become calibrate() samples with positive per-byte load cost and per-batch compute cost."""

import numpy as np
import pytest

from mmhost.demo_models import build_onnx_mlp, onnx_manifest
from protos import grpc_service_pb2 as pb
from sim.costs import calibrate
from sim.fidelity import batch_samples, load_sample, measured_sizes, parse_hostd_metrics
from storage_adapters.local import LocalStorage
from catalog.publish import publish_version
from catalog.repository import ModelRepository
from tests.hostd_proc import HostdProc

WIDTHS = {"small": 128, "mid": 600, "large": 1300}  # 256-w-w-10 MLPs: about 0.2, 2.1 and 8.1 MB


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    root = tmp_path_factory.mktemp("fid-store")
    repo = ModelRepository(LocalStorage(root))
    work = tmp_path_factory.mktemp("fid-models")
    for name, w in WIDTHS.items():
        f = work / f"{name}.onnx"
        build_onnx_mlp(f, (256, w, w, 10))
        publish_version(repo, onnx_manifest("fid", name, "1", f, "model.onnx"), {"model.onnx": f})
    h = HostdProc(str(root), tmp_path_factory.mktemp("fid-hostd"), tenant="fid", args=["--lazy"])
    yield h
    h.stop()


def _infer(h: HostdProc, model: str, rows: int = 1) -> None:
    x = np.ones((rows, 256), np.float32)
    req = pb.ModelInferRequest(model_name=model, raw_input_contents=[x.tobytes()],
                               inputs=[pb.ModelInferRequest.InferInputTensor(name="input", datatype="FP32", shape=[rows, 256])])
    h.stub.ModelInfer(req, metadata=(("mmhost-tenant", "fid"),), timeout=30)


def test_scraped_metrics_calibrate_positive_load_and_compute_costs(host):
    scrapes = [parse_hostd_metrics(host.metrics_text())]
    for name in WIDTHS:  # one first load (from storage) per scrape interval, then a few batches
        _infer(host, name)
        for rows in (1, 4):
            _infer(host, name, rows)
        scrapes.append(parse_hostd_metrics(host.metrics_text()))
    # unloaded, then asked for again: the reload comes from the host-RAM tier
    host.stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name="large"),
                                    metadata=(("mmhost-tenant", "fid"),), timeout=30)
    _infer(host, "large")
    scrapes.append(parse_hostd_metrics(host.metrics_text()))

    sizes = measured_sizes(scrapes)
    assert set(sizes) == {f"fid/{n}/1" for n in WIDTHS} and all(v > 0 for v in sizes.values())
    loads = [load_sample(a, b, sizes) for a, b in zip(scrapes, scrapes[1:], strict=False)]
    assert [(s["tier"], s["count"]) for s in loads] == [("storage", 1)] * 3 + [("host_ram", 1)]
    assert all(s["seconds"] > 0 and s["bytes"] == sizes[f"fid/{n}/1"] for s, n in zip(loads, [*WIDTHS, "large"], strict=False))
    batches = batch_samples(scrapes[-1:])
    assert {b["model"] for b in batches} == {f"fid/{n}/1" for n in WIDTHS}
    assert all(b["size"] > 1 for b in batches)  # rows per batch: the 4-row requests count

    costs = calibrate({"loads": loads, "batches": batches})
    assert costs.load_s_per_byte["storage"] > 0
    assert costs.load_seconds(sizes["fid/large/1"], "storage") > costs.load_seconds(sizes["fid/small/1"], "storage")
    assert all(costs.batch_seconds(f"fid/{n}/1", 1) > 0 for n in WIDTHS)


def test_sim_calibrate_from_a_real_hostd_writes_a_config_sim_run_accepts(host, tmp_path):
    import json

    import yaml
    from typer.testing import CliRunner

    from mmhost.cli import app

    for name in WIDTHS:  # loads (from storage or host RAM, whichever this module's host has now) and batches
        host.stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name=name),
                                        metadata=(("mmhost-tenant", "fid"),), timeout=30)
        _infer(host, name, 2)
    out = tmp_path / "cal.yaml"
    runner = CliRunner()
    res = runner.invoke(app, ["sim", "calibrate", "--from-metrics", f"127.0.0.1:{host.metrics_port}",
                              "--samples", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    cfg = yaml.safe_load(out.read_text())
    assert cfg["hosts"] == 1 and cfg["cache_bytes"] > 0 and cfg["load_workers"] == 4 and cfg["slots"] >= 1
    c = cfg["costs"]
    assert c["load_fixed_s"] + c["locked_s_per_byte"] * 1e6 > 0  # the locked stage of the loads it saw
    assert {b["model"] for b in c["batches"]} == {f"fid/{n}/1" for n in WIDTHS}

    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"ts": i * 0.05, "tenant": "fid", "model": name, "version": "1",
                                         "size_bytes": 2_000_000}) + "\n"
                             for i, name in enumerate(list(WIDTHS) * 10)))
    res = runner.invoke(app, ["sim", "run", "--config", str(out), "--trace", str(trace)])
    assert res.exit_code == 0, res.output
    assert "30 requests" in res.output and "p99" in res.output

    bad = runner.invoke(app, ["sim", "calibrate", "--from-metrics", f"127.0.0.1:{host.port}", "--samples", "1",
                              "--timeout", "1", "--out", str(tmp_path / "x.yaml")])
    assert bad.exit_code != 0 and not (tmp_path / "x.yaml").exists()


def test_a_scrape_keeps_the_prepack_after_ready_out_of_the_loads_own_seconds():
    page = "\n".join([
        "# TYPE mmhost_model_load_duration_seconds histogram",
        'mmhost_model_load_duration_seconds_count{phase="deserialize"} 3.0',
        'mmhost_model_load_duration_seconds_sum{phase="deserialize"} 0.3',
        'mmhost_model_load_duration_seconds_count{phase="prepack"} 2.0',
        'mmhost_model_load_duration_seconds_sum{phase="prepack"} 0.1',
    ]) + "\n"
    s = parse_hostd_metrics(page)
    assert s.load_seconds == pytest.approx(0.3)  # no load waited for the prepack
    assert s.phases == {"deserialize": pytest.approx(0.3), "prepack": pytest.approx(0.1)}
    assert s.phase_counts == {"deserialize": 3.0, "prepack": 2.0}
