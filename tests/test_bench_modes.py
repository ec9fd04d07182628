"""`stfast bench modes` on a tiny synthetic city: runs the chosen modes, writes the three files."""
import json

import pytest

from stfast.bench.modes import default_modes, table, time_to_target
from stfast.cli import main


def test_time_to_target_is_the_first_validation_at_or_below():
    curve = [(5.0, 0.40), (9.0, 0.30), (14.0, 0.31), (20.0, 0.25)]
    assert time_to_target(curve, 0.30) == 9.0 and time_to_target(curve, 0.2) is None


def test_every_default_mode_has_distinct_name_and_flags():
    modes = default_modes()
    assert len({m.name for m in modes}) == len(modes)
    assert len({tuple(m.flags) for m in modes}) == len(modes)


@pytest.mark.slow
def test_bench_modes_runs_and_writes_json_md_png(tmp_path, capsys):
    out = tmp_path / "bench"
    rc = main(["bench", "modes", "--n-synthetic", "240", "--budget-s", "6", "--target-mape", "80", "--batch-size", "16", "--threads", "1",
               "--only", "fused kernels", "--only", "accumulation k=2", "--out", str(out)])
    assert rc == 0
    res = json.loads((out / "modes.json").read_text())
    runs = {n: m["runs"] for n, m in res["modes"].items()}
    assert set(runs) == {"single process, fused kernels", "data parallel + accumulation k=2"}
    for r in runs.values():
        assert r[0]["samples_per_s"] > 0 and 0 < r[0]["test_mape"] < 5 and r[0]["steps"] > 0
    assert runs["data parallel + accumulation k=2"][0]["comm_share"] is not None
    md = (out / "modes.md").read_text()
    assert "| single process, fused kernels |" in md and md == table(res["modes"], res["target_mape"]) + "\n"
    assert (out / "modes.png").read_bytes()[:4] == b"\x89PNG"


def test_bench_modes_rejects_unknown_mode(tmp_path, capsys):
    assert main(["bench", "modes", "--only", "no such mode", "--out", str(tmp_path)]) == 2
    assert "no mode matches" in capsys.readouterr().err


def test_a_failing_mode_is_reported_and_the_others_still_run(tmp_path, monkeypatch):
    from stfast.bench import modes

    def fake_run(mode, seed, a, out):
        if "k=2" in mode.name:
            raise RuntimeError(f"mode {mode.name!r} seed {seed} failed (rc 1)")
        return {"curve": [(1.0, 0.5), (2.0, 0.3)], "samples_per_s": 10.0 + seed, "test_mape": 0.3,
                "test_mae": 50.0, "test_rmse": 70.0, "best_val_mape": 0.3, "steps": 5, "imbalance": None,
                "comm_share": None}

    monkeypatch.setattr(modes, "_run", fake_run)
    assert main(["bench", "modes", "--only", "fused kernels", "--only", "accumulation k=", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "modes.json").read_text())["modes"]
    assert "FAILED" in res["data parallel + accumulation k=2"]["skipped"]
    assert res["data parallel + accumulation k=4"]["runs"][0]["steps"] == 5
    md = (tmp_path / "modes.md").read_text()
    assert "| data parallel + accumulation k=2 | FAILED" in md and "time to target" in md
