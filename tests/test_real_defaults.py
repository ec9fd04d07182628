"""Issue 25: defaults that hold on real data — the presets, the weekday/weekend embedding, stochastic
weight averaging (stfast.train.swa), and the real-data default against constant speed on Chengdu."""
import json
import math
from dataclasses import fields, replace

import numpy as np
import pytest
import torch

from conftest import random_trips
from stfast.cli import build_parser, main
from stfast.data.dataset import DriverVocab, NormStats, TripDataset
from stfast.models.deeptte import DeepTTE, DeepTTEConfig
from stfast.train import checkpoint as ckpt
from stfast.train import presets, swa
from stfast.train.config import TrainConfig
from stfast.train.trainer import Trainer, evaluate


@pytest.fixture(scope="module")
def make_cfg(tmp_path_factory):
    """TrainConfig(out=OUT, **kw) of short float runs on 120 random trips (1 thread, B 16)."""
    path = tmp_path_factory.mktemp("data") / "trips.jsonl"
    random_trips(120, seed=25, max_len=25).to_jsonl(path)
    base = dict(data=str(path), format="deeptte", epochs=1, batch_size=16, seed=3, progress=False, threads=1)
    return lambda out, **kw: TrainConfig(**(base | {"out": str(out)} | kw))


def _train_config(argv):
    """The TrainConfig `stfast train ARGV` would run (the CLI's own parsing and preset filling)."""
    import stfast.train.trainer as trainer

    seen, real_train = {}, trainer.train

    def fake_train(c, **_):
        seen["cfg"] = c
        return {}  # train's result: a summary dict

    trainer.train = fake_train
    try:
        assert main(["train", *argv]) == 0
    finally:
        trainer.train = real_train
    return seen["cfg"]


# ---------------------------------------------------------------- presets
PAPER = {"epochs": 10, "lr": 1e-3, "weight_decay": 0.0, "head": "paper", "loss": "mape", "dropout": 0.0,
         "driver_dim": 16, "time_bin_min": 1, "week": "day", "swa_start": "none", "select": "best",
         "hidden_size": 128, "members": 1, "subtrips": 0, "subtrips_resample": "once"}  # main before presets (no sub-trips)


def test_paper_preset_is_todays_default_config_exactly():
    """--preset paper gives the TrainConfig the defaults gave before presets, on a file as on the synthetic
    city; --preset auto does so on the synthetic city; the Python API resolves as the command line does."""
    assert presets.PRESETS["paper"] == PAPER
    for argv in (["--data", "x.jsonl", "--preset", "paper"], ["--preset", "paper"], []):
        got = _train_config([*argv, "--out", "o"])
        assert got.preset == "paper" and {k: getattr(got, k) for k in presets.FIELDS} == PAPER, argv
        assert got == TrainConfig(data=got.data, out="o", preset="paper" if argv else "auto"), argv
    model = {f.name: f.default for f in fields(DeepTTEConfig)}  # the paper's model is DeepTTEConfig's defaults
    assert all(PAPER[k] == model[k] for k in presets.FIELDS if k in model)


def test_auto_preset_is_real_on_files_and_given_values_win():
    got = _train_config(["--data", "x.jsonl", "--out", "o"])
    assert got.preset == "real"
    assert {k: getattr(got, k) for k in presets.FIELDS} == presets.PRESETS["real"]
    assert got == TrainConfig(data="x.jsonl", out="o")  # the Python API: the same resolution
    got = _train_config(["--data", "x.jsonl", "--out", "o", "--head", "paper", "--epochs", "3", "--swa-start", "none"])
    assert (got.head, got.epochs, got.swa_start, got.loss) == ("paper", 3, "none", presets.PRESETS["real"]["loss"])
    assert got == TrainConfig(data="x.jsonl", out="o", head="paper", epochs=3, swa_start="none")
    got = _train_config(["--data", "x.jsonl", "--out", "o", "--ema-decay", "0.9"])  # replaces the preset's average
    assert (got.ema_decay, got.swa_start) == (0.9, "none")
    assert _train_config(["--format", "synthetic", "--data", "x", "--out", "o"]).preset == "paper"
    # a filled config is a fixed point: a checkpoint's train_config, a dataclasses.replace of it
    cfg = TrainConfig(data="x.jsonl")
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg and replace(cfg, data=None).preset == "real"
    legacy = {k: v for k, v in TrainConfig(data="x.jsonl", preset="paper").to_dict().items()
              if k not in ("preset", "week", "swa_start", "select", "hidden_size", "members")}
    assert TrainConfig.from_dict(legacy) == TrainConfig(data="x.jsonl", preset="paper")  # written before presets
    with pytest.raises(ValueError, match="^--preset must be one of auto, real, paper, got 'nope'$"):
        TrainConfig(preset="nope")


def test_bad_preset_and_averaging_values_name_the_flag(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--preset", "nope"])
    assert "argument --preset: invalid choice: 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--swa-start", "half"])
    assert "argument --swa-start: invalid float or 'none' value: 'half'" in capsys.readouterr().err


def test_help_names_each_presets_default(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--preset {auto,real,paper}" in text
    assert "[preset] (default: paper mape, real log)" in text


# ---------------------------------------------------------------- weekday / weekend
def test_weekend_embedding_shares_rows_by_weekday_or_weekend():
    trips = random_trips(14, seed=7)
    trips.week_id[:] = np.arange(14) % 7
    model = DeepTTE(DeepTTEConfig(n_drivers=2, week="weekend"), NormStats.from_trips(trips)).eval()
    assert model.attr.week.num_embeddings == 2
    b = TripDataset(trips, DriverVocab([]), torch.float32).batch(np.arange(14))
    attr = model.attr(b.driver, b.week_id, b.time_id, torch.zeros(14))
    week = attr[:, model.cfg.driver_dim:model.cfg.driver_dim + model.cfg.week_dim]
    for i in range(14):
        assert torch.equal(week[i], model.attr.week.weight[int(trips.week_id[i] >= 5)])
    with pytest.raises(ValueError, match="week"):
        DeepTTEConfig(n_drivers=2, week="month")


# ---------------------------------------------------------------- stochastic weight averaging
def test_swa_checkpoints_the_mean_of_the_weights_of_the_averaged_epochs(make_cfg, tmp_path):
    """checkpoint.pt = (1/n) Σ θ_t over the optimizer steps of epochs ⌊0.5 · 4⌋ = 2 and 3 (hand computed,
    float64), validation scored exactly those weights, and --select last keeps the last epoch."""
    tr = Trainer(make_cfg(tmp_path, dtype="float64", epochs=4, swa_start=0.5, select="last"))
    seen, orig = [], tr.train_step

    def spy(gb, use_local):
        loss = orig(gb, use_local)
        seen.append((tr.epoch, {k: v.detach().clone() for k, v in tr.model.named_parameters()}))
        return loss

    tr.train_step = spy
    tr.fit()
    tail = [p for e, p in seen if e >= 2]
    assert 0 < len(tail) < len(seen)
    want = {n: sum(p[n] for p in tail) / len(tail) for n in tail[0]}
    best, last = ckpt.load(tmp_path / "checkpoint.pt"), ckpt.load(tmp_path / "last.pt")
    for n, v in want.items():
        assert torch.allclose(best["model_state"][n], v, rtol=1e-12, atol=1e-14), n
        assert torch.equal(last["model_state"][n], seen[-1][1][n]), n  # last.pt: the trained weights
    assert int(last["ema_state"]["n_averaged"]) == len(tail)
    rows = [r for r in map(json.loads, open(tmp_path / "metrics.jsonl")) if r["type"] == "epoch"]
    assert best["epoch"] == 4 and last["best_val_mape"] == rows[-1]["val_mape"]  # --select last
    tr.model.load_state_dict(best["model_state"])
    assert evaluate(tr.model, tr.data.val_ds)["mape"] == pytest.approx(rows[-1]["val_mape"], rel=1e-12)


def test_swa_before_its_start_validates_the_trained_model():
    model = torch.nn.Linear(2, 1)
    avg = swa.build(TrainConfig(swa_start=0.5, epochs=4), model, k=lambda: 1, epoch=lambda: 1)
    avg.update_parameters(model)  # epoch 1 < 2: not averaged
    assert int(avg.n_averaged) == 0 and swa.eval_model(model, avg) is model
    assert swa.swa_start_epoch(0.5, 4) == 2 and swa.swa_start_epoch(0.99, 3) == 2
    assert swa.keeps("best", 0.2, 0.1) is False and swa.keeps("last", 0.2, 0.1) is True


def test_swa_resumes_bitwise(make_cfg, tmp_path):
    kw = dict(dtype="float64", epochs=3, swa_start=0.3, select="last")
    Trainer(make_cfg(tmp_path / "full", **kw)).fit()
    Trainer(make_cfg(tmp_path / "part", max_steps=9, **kw)).fit()  # stops mid-epoch 2, averaging
    Trainer(make_cfg(tmp_path / "part", resume=True, **kw)).fit()
    for name in ("checkpoint.pt", "last.pt"):
        a = ckpt.load(tmp_path / "full" / name)["model_state"]
        b = ckpt.load(tmp_path / "part" / name)["model_state"]
        assert all(torch.equal(a[k], b[k]) for k in a), name


def test_resume_continues_with_the_runs_own_preset_options(tmp_path):
    """--resume with the [preset] options left out continues with the run's own values (its checkpoint's),
    not the preset's: a run started with --epochs 2 --hidden-size 16 --swa-start none and stopped mid-run ends
    after epoch 2 at width 16; an option given on the command line still wins."""
    data = tmp_path / "trips.jsonl"
    random_trips(60, seed=27, max_len=20).to_jsonl(data)
    out = tmp_path / "run"
    common = ["--data", str(data), "--format", "deeptte", "--batch-size", "16", "--threads", "1", "--no-progress",
              "--out", str(out)]
    assert main(["train", *common, "--epochs", "2", "--hidden-size", "16", "--swa-start", "none",
                 "--max-steps", "4"]) == 0
    resumed = TrainConfig(data=str(data), format="deeptte", out=str(out), resume=True)
    assert (resumed.epochs, resumed.hidden_size, resumed.swa_start, resumed.preset) == (2, 16, "none", "real")
    assert TrainConfig(data=str(data), format="deeptte", out=str(out), resume=True, epochs=3).epochs == 3
    fresh = TrainConfig(data=str(data), format="deeptte", out=str(tmp_path / "new"))
    assert fresh.epochs == presets.PRESETS["real"]["epochs"]
    assert main(["train", *common, "--resume"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["epochs"] == 2 and ckpt.load(out / "checkpoint.pt")["model_config"]["hidden_size"] == 16
    # a checkpoint written before --subtrips existed: that run had none, and resumes with none
    for name in ("last.pt", "last.prev.pt", "checkpoint.pt"):
        if (out / name).is_file():
            st = ckpt.load(out / name)
            assert st["train_config"].pop("subtrips") == presets.PRESETS["real"]["subtrips"] == 1
            ckpt.save_atomic(st, out / name)
    assert TrainConfig(data=str(data), format="deeptte", out=str(out), resume=True).subtrips == 0


@pytest.mark.parametrize("kw, message", [
    (dict(swa_start=1.0), "--swa-start must be in [0, 1), got 1"),
    (dict(swa_start="half"), "--swa-start must be a number or none, got 'half'"),
    (dict(swa_start=0.5, ema_decay=0.9), "--swa-start and --ema-decay are two averages of the weights"),
    (dict(select="first"), "--select must be best or last, got 'first'"),
    (dict(week="x"), "--week must be day or weekend, got 'x'"),
    (dict(ema_decay=1.0), "--ema-decay must be in (0, 1), got 1"),
    (dict(data="x.jsonl", patience=3), "--patience stops at the best validation epoch, --select last"),
])
def test_averaging_options_are_validated(kw, message):
    with pytest.raises(ValueError) as e:
        TrainConfig(**kw).validate()
    assert str(e.value).startswith(message)
    TrainConfig(data="x.jsonl", patience=3, select="best").validate()  # patience with the best epoch: fine


# ---------------------------------------------------------------- the real-data default on Chengdu
@pytest.mark.slow
def test_real_default_beats_constant_speed_on_the_chengdu_date_split(shared_data, tmp_path, capsys):
    """`stfast train` with default flags on the Chengdu sample split by date (train days 24-28, validation
    29, test 30): test MAPE and MAE below constant speed's (28.85 %, 364.4 s). Seed 0, 1 thread."""
    data = shared_data / "chengdu_deeptte_sample" / "test"
    out = tmp_path / "run"
    assert main(["train", "--data", str(data), "--split-days", "24-28/29/30", "--threads", "1", "--no-progress",
                 "--out", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert ckpt.load(out / "checkpoint.pt")["train_config"]["preset"] == "real"
    assert s["test_mape"] < s["baseline_const_speed_mape"] and s["test_mae"] < s["baseline_const_speed_mae"], s
    assert math.isclose(s["baseline_const_speed_mape"], 0.2885, abs_tol=5e-4)
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", str(out / "checkpoint.pt"), "--split", "test"]) == 0
    assert f"MAPE {100 * s['test_mape']:.2f} %" in capsys.readouterr().out  # the averaged weights were saved
