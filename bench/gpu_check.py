"""GPU check for a machine with an NVIDIA GPU; prints a clear skip message elsewhere and exits 0.

Drives hostd's real code in-process (runtimes, NVML probe, device cache and eviction policy) and prints:
  1. NVML-measured device memory per loaded model, next to its file size;
  2. evictions forced past the high watermark while loading more models than the budget holds, with NVML
     used memory checked against the budget after every load;
  3. how much NVML-measured memory unloading returns (target >= 95%);
  4. host-to-device bandwidth: pinned and pageable torch copies, and our model load (bytes / seconds)
     as a fraction of the pinned bandwidth (target >= 50%);
  5. execution: 4 slots, 1 CPU thread per session, one CUDA stream per instance (torch; ORT: per session).
Runs in well under 5 minutes. ONNX models use ONNX Runtime's CUDA provider when this onnxruntime has it;
otherwise TorchScript models on torch CUDA (and the output says the ORT CUDA path was not checked).

On the device machine (its python3 has torch, onnxruntime, nvidia-ml-py, numpy, psutil; carry pydantic's
wheels: pydantic, pydantic-core, annotated-types, typing-inspection):
    python3 bench/gpu_check.py [--models 6] [--mb 256]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def gpu_present() -> str | None:
    """None when a usable GPU is present, else why not."""
    try:
        import pynvml

        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() < 1:
            return "NVML sees no GPU"
    except Exception as e:  # NVMLError_LibraryNotFound on machines without a driver
        return f"NVML unavailable ({type(e).__name__})"
    try:
        import torch

        if not torch.cuda.is_available():
            return "torch sees no CUDA device"
    except ImportError:
        return "torch is not installed"
    return None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", type=int, default=6)
    ap.add_argument("--mb", type=int, default=256, help="approximate size of each model")
    a = ap.parse_args()
    why = gpu_present()
    if why:
        print(f"gpu_check: SKIPPED, no GPU here: {why}")
        return 0

    import numpy as np
    import onnxruntime as ort
    import torch

    from hostd.cache.device import DeviceCache
    from hostd.memory import NvmlProbe
    from hostd.runtimes.base import DeviceSpec
    from hostd.runtimes.registry import load_model, prepare_runtime
    from mmhost.demo_models import build_onnx_mlp, onnx_manifest, torch_manifest
    from ground.manifest import FileEntry, ModelFormat

    t_start = time.perf_counter()
    probe = NvmlProbe(0)
    dev = DeviceSpec(kind="cuda", index=0)
    use_ort = "CUDAExecutionProvider" in ort.get_available_providers()
    runtime = ("ONNX Runtime CUDA provider" if use_ort
               else "torch CUDA (this onnxruntime has no CUDA provider: ORT CUDA path NOT checked)")
    print(f"GPU: {torch.cuda.get_device_name(0)}, NVML total {probe.total() / 2**30:.1f} GiB; runtime: {runtime}")
    width = int((a.mb * 2**20 / 4 / 2) ** 0.5)  # two square layers of float32
    fmt = ModelFormat.ONNX if use_ort else ModelFormat.TORCHSCRIPT
    prepare_runtime(fmt, dev)
    failures: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        blobs, manifests = [], []
        for i in range(a.models):
            p = Path(tmp) / f"m{i}"
            if use_ort:
                build_onnx_mlp(p, (width, width, width), seed=i)
                m = onnx_manifest("gpu", f"m{i}", "1", p, "model.onnx")
            else:
                from mmhost.demo_models import build_torchscript

                build_torchscript(p, in_dim=width, out_dim=width, seed=i, hidden=width)
                m = torch_manifest("gpu", f"m{i}", "1", fmt, "model.pt", in_dim=width, out_dim=width)
            data = p.read_bytes()
            m = m.model_copy(update={"files": [FileEntry(path=m.model_file, size=len(data), sha256="0" * 64)]})
            blobs.append(data)
            manifests.append(m)
        size = len(blobs[0])

        def warm(model, m) -> None:
            x = {t.name: np.zeros([1 if d == -1 else d for d in t.shape], np.float32) for t in m.inputs}
            model.run(x, [o.name for o in m.outputs])
            torch.cuda.synchronize()

        # 1. measured memory per model
        print(f"\n1. NVML-measured memory per model (file {size / 2**20:.0f} MiB each)")
        base = probe.used()
        loaded, measured, load_s = [], [], []
        for m, data in zip(manifests, blobs, strict=True):
            before = probe.used()
            t0 = time.perf_counter()
            model = load_model(data, m, dev)
            warm(model, m)
            load_s.append(time.perf_counter() - t0)
            measured.append(probe.used() - before)
            loaded.append(model)
            print(f"   {m.model}: {measured[-1] / 2**20:8.1f} MiB measured, load {load_s[-1] * 1000:.0f} ms")
        peak = probe.used()

        # 3. unload returns memory
        for model in loaded:
            model.close()
        loaded.clear()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        after = probe.used()
        returned = (peak - after) / max(1, peak - base)
        print(f"\n3. unload: {((peak - base) / 2**20):.0f} MiB held, {((peak - after) / 2**20):.0f} MiB returned = {returned * 100:.1f}% "
              f"(target >= 95%): {'ok' if returned >= 0.95 else 'MISSED'}")
        if returned < 0.95:
            failures.append("unload returned less than 95%")

        # 2. evictions past the high watermark, through the real device cache and policy
        per = max(measured)
        budget = int(per * 3.5)
        cache = DeviceCache(budget, high=0.9, low=0.6, policy="lru")
        resident: dict = {}
        evictions = 0
        worst = 0
        base2 = probe.used()
        for _round in range(2):
            for m, data in zip(manifests, blobs, strict=True):
                key = m.key()
                if key in resident:
                    cache.access(key, time.monotonic())
                    continue
                plan = cache.reserve(key, m.tenant, per, time.monotonic())
                if not plan.ok:
                    failures.append(f"could not make room for {m.model}: {plan.reason}")
                    continue
                for victim in plan.evict:
                    resident.pop(victim).close()
                    cache.release(victim)
                    evictions += 1
                torch.cuda.empty_cache()
                before = probe.used()
                model = load_model(data, m, dev)
                warm(model, m)
                cache.loaded(key, probe.used() - before, 0.1, time.monotonic())
                resident[key] = model
                worst = max(worst, probe.used() - base2)
        print(f"\n2. budget {budget / 2**20:.0f} MiB (3.5 models), watermarks 0.9/0.6, {2 * a.models} requests over "
              f"{a.models} models: {evictions} evictions; worst NVML use above baseline {worst / 2**20:.0f} MiB "
              f"({'within' if worst <= budget * 1.05 else 'OVER'} budget)")
        if worst > budget * 1.05:
            failures.append("NVML use went over the device budget")
        for model in resident.values():
            model.close()
        torch.cuda.empty_cache()

        # 4. bandwidth
        n = 1 << 30
        host_pinned = torch.empty(n, dtype=torch.uint8).pin_memory()
        host_page = torch.empty(n, dtype=torch.uint8)
        dev_buf = torch.empty(n, dtype=torch.uint8, device="cuda")

        def bw(src) -> float:
            dev_buf.copy_(src, non_blocking=False)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(5):
                dev_buf.copy_(src, non_blocking=False)
            torch.cuda.synchronize()
            return 5 * n / (time.perf_counter() - t0)

        pinned, pageable = bw(host_pinned), bw(host_page)
        ours = size / min(load_s[1:] or load_s)
        print(f"\n4. host-to-device: pinned {pinned / 1e9:.1f} GB/s, pageable {pageable / 1e9:.1f} GB/s; "
              f"model load (deserialize + upload + warm-up) {ours / 1e9:.2f} GB/s = {ours / pinned * 100:.1f}% of pinned "
              f"(target >= 50%): {'ok' if ours >= 0.5 * pinned else 'MISSED'}")
    failures += streams_check(tmp_dir=None)
    print(f"\ngpu_check finished in {time.perf_counter() - t_start:.0f}s; "
          + ("all checks ok" if not failures else "FAILED: " + "; ".join(failures)))
    return 1 if failures else 0


def streams_check(tmp_dir: str | None) -> list[str]:
    """5. Execution on a GPU (hostd/core/sizing.py): 4 slots, 1 CPU thread per session, and one CUDA stream per
    instance: a torch model run by 2 instances at once uses 2 streams of its own (not the default stream), and
    answers as run alone. ONNX Runtime's CUDA provider gives each session (each model) its own stream."""
    import concurrent.futures as cf

    import numpy as np
    from ground.manifest import ModelFormat
    from hostd.core.sizing import plan_execution
    from hostd.runtimes.base import DeviceSpec
    from hostd.runtimes.torch_rt import TorchModel
    from mmhost.demo_models import build_torchscript, torch_manifest

    plan = plan_execution(2, "cuda")
    with tempfile.TemporaryDirectory(dir=tmp_dir) as tmp:
        p = Path(tmp) / "streams.pt"
        build_torchscript(p, in_dim=1024, out_dim=1024, hidden=4096)
        m = torch_manifest("gpu", "streams", "1", ModelFormat.TORCHSCRIPT, "model.pt", in_dim=1024, out_dim=1024)
        model = TorchModel(p, m, DeviceSpec(kind="cuda", index=0, torch_threads=plan.threads))
        x = {m.inputs[0].name: np.random.default_rng(0).random((256, 1024), dtype=np.float32)}
        ref = model.run(x, [])
        with cf.ThreadPoolExecutor(2) as pool:  # 2 instances at once, many times
            outs = list(pool.map(lambda _: model.run(x, []), range(64)))
        same = all(np.allclose(o[k], ref[k], atol=1e-4) for o in outs for k in ref)
        ok = plan.slots == 4 and plan.threads == 1 and 1 <= model.streams_made <= 2 and same
        print(f"\n5. execution on a GPU: {plan.slots} slots x {plan.threads} CPU thread per session; torch model, 2 "
              f"instances at once: {model.streams_made} CUDA streams of its own (one per instance, never the default "
              f"stream), answers equal to a lone run: {same}: {'ok' if ok else 'FAILED'}")
        model.close()
    return [] if ok else ["one CUDA stream per instance"]


if __name__ == "__main__":
    sys.exit(main())
