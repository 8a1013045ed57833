import csv

from sim.mrc import knee_index, plot, sweep, write_csv
from sim.workload import SyntheticConfig, generate


def test_knee_of_a_concave_curve():
    xs = [1, 2, 3, 4, 5, 6, 7, 8]
    ys = [0.1, 0.5, 0.7, 0.78, 0.82, 0.84, 0.85, 0.86]
    assert knee_index(xs, ys) == 2
    assert knee_index([1, 2, 3], [0.5, 0.5, 0.5]) is None
    assert knee_index([1, 2], [0.1, 0.2]) is None


def test_sweep_is_monotonic_ish_and_writes_png_and_csv(tmp_path):
    wl = generate(SyntheticConfig(models=200, requests=20_000, seed=1))
    fractions = [0.02, 0.05, 0.1, 0.2, 0.4, 0.8]
    rows = sweep(wl, fractions, ("lru", "gdsf", "offline"))
    assert len(rows) == 18
    for policy in ("lru", "gdsf", "offline~"):  # mixed sizes: the offline figure is the heuristic, named so
        hits = [r["hit_rate"] for r in rows if r["policy"] == policy]
        assert all(b >= a - 0.01 for a, b in zip(hits, hits[1:], strict=False)), (policy, hits)
        assert hits[-1] > hits[0] + 0.2
        assert sum(r["knee"] for r in rows if r["policy"] == policy) == 1
    by = {(r["policy"], r["cache_fraction"]): r for r in rows}
    for f in fractions:
        assert by[("offline~", f)]["hit_rate"] >= by[("lru", f)]["hit_rate"]
    # models larger than a 2% cache are shed (and counted); at 80% every model fits
    biggest = max(m.size for m in wl.models)
    assert biggest > by[("lru", 0.02)]["cache_bytes"] and by[("lru", 0.02)]["shed_rate"] > 0
    assert by[("lru", 0.8)]["shed_rate"] == 0.0
    csv_path = write_csv(rows, tmp_path / "mrc.csv")
    png = plot(rows, tmp_path / "mrc.png", "test")
    with open(csv_path) as fh:
        read = list(csv.DictReader(fh))
    assert len(read) == 18 and read[0]["policy"] == "lru" and float(read[-1]["cache_fraction"]) == 0.8
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
