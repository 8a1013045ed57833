"""ground/cpus.py: the CPUs a process may use, from its affinity and its cgroup's CPU limit (containers)."""

from __future__ import annotations

from pathlib import Path

from ground.cpus import cgroup_quota, quota_from_cfs, quota_from_cpu_max, usable_cpus


def test_cpu_max_and_cfs_quotas():
    assert quota_from_cpu_max("max 100000\n") is None
    assert quota_from_cpu_max("150000 100000\n") == 1.5
    assert quota_from_cfs("-1", "100000") is None
    assert quota_from_cfs("400000", "100000") == 4.0


def _v2(tmp_path: Path, path: str, limits: dict[str, str]) -> tuple[Path, Path]:
    root = tmp_path / "cg"
    for rel, text in limits.items():
        (root / rel).mkdir(parents=True, exist_ok=True)
        (root / rel / "cpu.max").write_text(text)
    (root / path.lstrip("/")).mkdir(parents=True, exist_ok=True)
    proc = tmp_path / "cgroup"
    proc.write_text(f"0::{path}\n")
    return root, proc


def test_a_limit_on_the_process_cgroup_or_any_parent_applies(tmp_path):
    root, proc = _v2(tmp_path, "/kubepods/pod1/c1", {"": "max 100000", "kubepods/pod1": "250000 100000",
                                                      "kubepods/pod1/c1": "max 100000"})
    assert cgroup_quota(root, proc) == 2.5
    root, proc = _v2(tmp_path / "b", "/", {"": "max 100000"})  # inside a container's namespace, no limit
    assert cgroup_quota(root, proc) is None


def test_cgroup_v1_cpu_controller(tmp_path):
    root = tmp_path / "cg"
    (root / "cpu").mkdir(parents=True)
    (root / "cpu" / "cpu.cfs_quota_us").write_text("200000\n")
    (root / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    proc = tmp_path / "cgroup"
    proc.write_text("4:memory:/x\n1:cpu,cpuacct:/docker/abc\n0::/\n")
    assert cgroup_quota(root, proc) == 2.0  # the namespaced path is absent: the mount's root is the container's
    assert cgroup_quota(root, tmp_path / "missing") is None


def test_usable_cpus_is_the_mask_lowered_to_the_quota_rounded_down():
    assert usable_cpus(quota=None, affinity=64) == 64
    assert usable_cpus(quota=4.0, affinity=64) == 4
    assert usable_cpus(quota=1.5, affinity=64) == 1  # threads never ask for more than the quota
    assert usable_cpus(quota=0.5, affinity=64) == 1
    assert usable_cpus(quota=8.0, affinity=2) == 2
