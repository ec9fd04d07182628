"""`stfast bench modes` on a tiny synthetic city: runs the chosen modes, writes the three files."""
import json
from pathlib import Path

import pytest

from stfast.bench.modes import DEFAULT_MODE, default_modes, default_target, table, time_to_target
from stfast.cli import main


def test_time_to_target_is_the_first_validation_at_or_below():
    curve = [(5.0, 0.40), (9.0, 0.30), (14.0, 0.31), (20.0, 0.25)]
    assert time_to_target(curve, 0.30) == 9.0 and time_to_target(curve, 0.2) is None


def test_default_target_falls_back_when_the_baseline_finished_no_epoch(capsys):
    def mode(*best):
        return {"runs": [{"best_val_mape": b, "curve": [], "samples_per_s": 1.0, "test_mape": 0.2, "test_mae": 1.0,
                          "test_rmse": 1.0, "imbalance": None, "comm_share": None} for b in best]}

    results = {"ref": mode(0.30, 0.20, 0.25), "fast": mode(0.10), "slow": mode(0.18), "broken": {"skipped": "FAILED"}}
    assert default_target(results, "ref") == 0.25  # the baseline's median
    results["ref"] = mode(None)  # no epoch in the budget: the loosest of the others, so all of them reach it
    assert default_target(results, "ref") == 0.18 and "'slow'" in capsys.readouterr().err
    none = {"ref": mode(None), "broken": {"skipped": "FAILED"}}
    assert default_target(none, "ref") is None
    assert "No target" in table(none, None) and time_to_target([(1.0, 0.1)], None) is None


def test_every_default_mode_has_distinct_name_and_flags():
    modes = default_modes()
    assert len({m.name for m in modes}) == len(modes)
    assert len({(tuple(m.flags), m.nproc, m.threads) for m in modes}) == len(modes)
    assert len({m.slug for m in modes}) == len(modes)  # one run folder each


@pytest.mark.slow
def test_bench_modes_runs_and_writes_json_md_png(tmp_path, capsys):
    out = tmp_path / "bench"
    rc = main(["bench", "modes", "--n-synthetic", "240", "--budget-s", "6", "--target-mape", "80", "--batch-size", "16", "--threads", "1",
               "--only", "fused kernels", "--only", "accumulation k=2", "--out", str(out)])
    assert rc == 0
    res = json.loads((out / "modes.json").read_text())
    runs = {n: m["runs"] for n, m in res["modes"].items()}
    assert set(runs) == {"single process, fused kernels", "single process, fused kernels, one thread (unequal hardware)",
                         "data parallel + accumulation k=2"}
    for r in runs.values():
        assert r[0]["samples_per_s"] > 0 and 0 < r[0]["test_mape"] < 5 and r[0]["steps"] > 0
        assert sum(w[2] for w in r[0]["windows"]) > 0  # the accumulation windows the paced clock re-times
    assert runs["data parallel + accumulation k=2"][0]["comm_share"] is not None
    md = (out / "modes.md").read_text()
    assert "| single process, fused kernels | 1 × 2 |" in md  # equal hardware: 2 ranks × 1 thread
    assert "| single process, fused kernels, one thread (unequal hardware) | 1 × 1 (unequal: 1 of 2 cores) |" in md
    assert md == table(res["modes"], res["target_mape"], res["cores"]) + "\n"
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
    assert main(["bench", "modes", "--only", "fused kernels", "--only", "accumulation k=", "--only", "default",
                 "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "modes.json").read_text())["modes"]
    assert "FAILED" in res["data parallel + accumulation k=2"]["skipped"]
    # the default is k = 2's configuration: its row says so, not a row of runs
    assert res[DEFAULT_MODE]["skipped"].startswith("FAILED (the configuration of data parallel + accumulation k=2; see ")
    assert res["data parallel + accumulation k=4"]["runs"][0]["steps"] == 5
    md = (tmp_path / "modes.md").read_text()
    assert "| data parallel + accumulation k=2 | FAILED" in md and "time to target" in md


def test_reuse_measures_a_finished_run_without_running_it(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from stfast.bench import modes

    run = tmp_path / "mode00" / "seed0"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"test_mape": 0.2, "test_mae": 30.0, "test_rmse": 40.0,
                                                  "best_val_mape": 0.19, "steps": 7}))
    (run / "metrics.jsonl").write_text(json.dumps({"type": "epoch", "epoch": 1, "step": 7, "train_loss": 0.3, "val_mape": 0.19,
                                                   "val_mae": 1.0, "val_rmse": 1.0, "samples_per_s": 50.0,
                                                   "wall_s": 3.0}) + "\n")

    def no_subprocess(*args, **kwargs):
        raise AssertionError("a finished run was started again")

    monkeypatch.setattr(modes.subprocess, "run", no_subprocess)
    a = SimpleNamespace(reuse=True, nproc=2, budget_s=60.0)
    got = modes._run(modes.default_modes()[0], 0, a, run)
    assert got["curve"] == [(3.0, 0.19)] and got["steps"] == 7 and got["samples_per_s"] == 50.0
    with pytest.raises(AssertionError, match="started again"):
        modes._run(modes.default_modes()[0], 0, SimpleNamespace(**{**vars(a), "reuse": False, "data": None,
                                                                    "n_synthetic": 10, "threads": None,
                                                                    "batch_size": 8}), run)


def _fake_bench(tmp_path, monkeypatch, args, ttt=lambda slug: 5.0):
    """Run `stfast bench modes ARGS` with every `stfast train` replaced: returns ({mode slug: the train
    command's (--nproc, --threads)}, modes.json, modes.md). ttt: a mode's time to target (s) by its slug."""
    from types import SimpleNamespace

    from stfast.bench import modes

    cmds = {}

    def fake_run(cmd, **kwargs):
        out = Path(cmd[cmd.index("--out") + 1])
        cmds[out.parent.name] = (int(cmd[cmd.index("--nproc") + 1]), int(cmd[cmd.index("--threads") + 1]))
        return SimpleNamespace(returncode=0)

    def fake_measure(out):
        t = ttt(out.parent.name)
        return {"curve": [(t, 0.2)], "samples_per_s": 100.0, "test_mape": 0.2, "test_mae": 50.0, "test_rmse": 70.0,
                "best_val_mape": 0.2, "steps": 5, "imbalance": None, "comm_share": None}

    monkeypatch.setattr(modes.subprocess, "run", fake_run)
    monkeypatch.setattr(modes, "_measure", fake_measure)
    assert main(["bench", "modes", *args, "--target-mape", "30", "--out", str(tmp_path)]) == 0
    return cmds, json.loads((tmp_path / "modes.json").read_text()), (tmp_path / "modes.md").read_text()


@pytest.mark.parametrize("args, cpus, cores", [(["--nproc", "2", "--threads", "1"], 2, 2),
                                               (["--nproc", "2"], 4, 4),  # default: the machine's cores / nproc
                                               (["--nproc", "4", "--threads", "2"], 2, 8)])
def test_every_mode_gets_the_same_cores_but_the_labelled_one(tmp_path, monkeypatch, args, cpus, cores):
    """Equal hardware: a single-process mode gets as many threads as the multi-process modes use cores in
    all (--nproc × --threads); the one row that does not is labelled so in its name and its cell."""
    from stfast.bench import modes

    monkeypatch.setattr(modes, "usable_cores", lambda: cpus)
    cmds, res, md = _fake_bench(tmp_path, monkeypatch, args)
    by_slug = {m.slug: m for m in default_modes()}
    # the default is data parallel + k = 2 under another name: that mode's runs, not run again
    assert set(cmds) == set(by_slug) - {default_modes()[-1].slug} and res["cores"] == cores
    assert res["modes"][DEFAULT_MODE]["same_as"] == "data parallel + accumulation k=2"
    for slug, (procs, threads) in cmds.items():
        mode = by_slug[slug]
        assert res["modes"][mode.name]["nproc"] == procs and res["modes"][mode.name]["threads"] == threads
        if "unequal" in mode.name:
            assert (procs, threads) == (1, 1)
            assert f"| {mode.name} | 1 × 1 (unequal: 1 of {cores} cores) |" in md
        else:
            assert procs * threads == cores and procs == (mode.nproc or int(args[1])), mode.name
            assert f"| {mode.name} | {procs} × {threads} |" in md
    assert sum("unequal" in m.name for m in default_modes()) == 1


def test_the_table_names_the_fastest_mode_on_equal_hardware_and_the_defaults_ratio(tmp_path, monkeypatch):
    times = {"single-process-fused-kernels-one-thread-unequal-hardware": 1.0,  # fastest, but on fewer cores
             "data-parallel-accumulation-k-4": 2.0, "data-parallel-accumulation-k-2": 3.0}
    _, res, md = _fake_bench(tmp_path, monkeypatch, ["--nproc", "2", "--threads", "1", "--seeds", "3"],
                             lambda slug: times.get(slug, 5.0))
    default = f"{DEFAULT_MODE} (= data parallel + accumulation k=2)"
    assert ("Fastest to target on equal hardware (median over seeds, a seed not reaching it counted as never): "
            f"data parallel + accumulation k=4, 2.0 s. {default}: 3.0 s, 1.50× the fastest.") in md
    assert f"| {DEFAULT_MODE} (= data parallel + accumulation k=2: the same configuration and runs) | 2 × 1 |" in md
    runs = res["modes"][DEFAULT_MODE]["runs"]
    runs[0]["curve"] = runs[1]["curve"] = [(1.0, 0.5)]  # two seeds of three never reach 30 %
    assert f"{default}: not reached in half or more of the seeds." in table(res["modes"], 0.3, res["cores"])


def test_modes_run_seed_major_and_the_paced_clock_removes_a_slow_seed(tmp_path, monkeypatch):
    """Every mode's seed 0, then every mode's seed 1, ...; a seed whose machine ran 3× slower reaches the target
    later on the wall clock and at its mode's median pace on the paced clock."""
    from types import SimpleNamespace

    from stfast.bench import modes

    order = []

    def fake_run(cmd, **kwargs):
        out = Path(cmd[cmd.index("--out") + 1])
        order.append((out.name, out.parent.name))
        return SimpleNamespace(returncode=0)

    def fake_measure(out):  # four windows of 100 trips; seed 1 of the k = 2 mode's first two windows 3× slower
        slow = 3.0 if (out.name, out.parent.name) == ("seed1", "data-parallel-accumulation-k-2") else 1.0
        lengths = [slow, slow, 1.0, 1.0]
        return {"curve": [(sum(lengths) + 0.5, 0.2)], "step_curve": [(16, 0.2)], "samples_per_s": 100.0,
                "test_mape": 0.2, "test_mae": 50.0, "test_rmse": 70.0, "best_val_mape": 0.2, "steps": 16,
                "imbalance": None, "comm_share": None, "windows": [(4 * (i + 1), 2, 100, w) for i, w in enumerate(lengths)]}

    monkeypatch.setattr(modes.subprocess, "run", fake_run)
    monkeypatch.setattr(modes, "_measure", fake_measure)
    args = ["bench", "modes", "--nproc", "2", "--threads", "1", "--seeds", "3", "--only", "fused kernels",
            "--only", "accumulation k=2", "--target-mape", "30", "--out", str(tmp_path)]
    assert main(args) == 0
    assert [seed for seed, _ in order] == ["seed0"] * 3 + ["seed1"] * 3 + ["seed2"] * 3
    md = (tmp_path / "modes.md").read_text()
    k2 = next(line for line in md.splitlines() if line.startswith("| data parallel + accumulation k=2 |"))
    assert "| 4.5 (4.5–8.5) | 4.0 (4.0–4.0) |" in k2  # wall clock (with 0.5 s of validation): 4.5, 8.5, 4.5 s
    assert "Fastest to target on equal hardware on the paced clock (each mode's windows at its median pace)" in md


def test_modes_differ_from_the_default_in_their_configuration_or_are_one_mode():
    """configuration() resolves what `stfast train` fills in at run time, so the default (no --accumulation, at
    --nproc 2) equals an explicit k = 2 and differs from k = 4 and from one process."""
    from types import SimpleNamespace

    from stfast.bench.modes import configuration

    a = SimpleNamespace(nproc=2, threads=1, budget_s=60.0, batch_size=64, data=None, n_synthetic=100)
    by_name = {m.name: configuration(m, a) for m in default_modes()}
    assert by_name[DEFAULT_MODE] == by_name["data parallel + accumulation k=2"]
    others = [n for n in by_name if n not in (DEFAULT_MODE, "data parallel + accumulation k=2")]
    assert all(by_name[n] != by_name[DEFAULT_MODE] for n in others)
    assert len({repr(by_name[n]) for n in others}) == len(others)  # every other mode is its own configuration


def test_bench_modes_rejects_zero_threads(tmp_path, capsys):
    assert main(["bench", "modes", "--threads", "0", "--out", str(tmp_path)]) == 2
    assert "--threads" in capsys.readouterr().err


@pytest.mark.parametrize("args, text", [
    (["--budget-s", "nan"], "--budget-s must be a number of seconds > 0"),
    (["--target-mape", "-3"], "--target-mape must be a MAPE in % in (0, 100)"),
    (["--target-mape", "150"], "--target-mape must be a MAPE in % in (0, 100)"),
    (["--batch-size", "0"], "--batch-size must be ≥ 1"),
])
def test_bench_modes_refuses_what_every_run_would_refuse_before_running_any(tmp_path, monkeypatch, capsys, args, text):
    from stfast.bench import modes

    monkeypatch.setattr(modes, "_run", lambda *a: pytest.fail("a run started"))
    assert main(["bench", "modes", *args, "--out", str(tmp_path / "b")]) == 2
    assert text in capsys.readouterr().err


def test_bench_modes_out_must_be_new_a_bench_folder_with_reuse(tmp_path, monkeypatch, capsys):
    """A bench folder rerun without --reuse had every mode fail ("not empty") and its modes.json overwritten
    by those failures; a file or a training run as --out got a traceback or a mode folder written into it.
    And a bench whose every mode failed exits 1."""
    from stfast.bench import modes

    monkeypatch.setattr(modes, "_run", lambda mode, seed, a, out: (_ for _ in ()).throw(RuntimeError("failed")))
    afile, run, bench = tmp_path / "afile", tmp_path / "run", tmp_path / "bench"
    afile.write_text("x")
    run.mkdir()
    (run / "metrics.jsonl").write_text("")
    bench.mkdir()
    (bench / "modes.json").write_text("{}")
    for out, text in ((afile, "is a file"), (bench, "give --reuse"), (run, "is not empty")):
        assert main(["bench", "modes", "--only", "fused kernels", "--out", str(out)]) == 2
        assert text in capsys.readouterr().err
    assert main(["bench", "modes", "--only", "fused kernels", "--reuse", "--out", str(run)]) == 2
    assert "holds files a bench run does not write (metrics.jsonl)" in capsys.readouterr().err
    assert (bench / "modes.json").read_text() == "{}"
    assert main(["bench", "modes", "--only", "fused kernels", "--out", str(tmp_path / "new")]) == 1
    assert "every mode failed" in capsys.readouterr().err


def test_the_one_thread_row_is_left_out_where_every_mode_gets_one_core(tmp_path, monkeypatch):
    """With --nproc 1 --threads 1 the labelled "one thread (unequal hardware)" row is the same configuration as
    the single-process fused row, on equal hardware: it was run again under a wrong label (and then named the
    fastest on equal hardware). It is left out there, and kept where it has fewer cores than the others."""
    label = "single process, fused kernels, one thread (unequal hardware)"
    only = ["--only", "single process"]
    _, res, md = _fake_bench(tmp_path / "one", monkeypatch, ["--nproc", "1", "--threads", "1", *only])
    assert label not in res["modes"] and "single process, fused kernels" in res["modes"] and label not in md
    _, res, _ = _fake_bench(tmp_path / "two", monkeypatch, ["--nproc", "2", "--threads", "1", *only])
    assert label in res["modes"]
