"""Warm start (issue 63 item 1): `stfast train --init-from CHECKPOINT --data NEW` starts from the checkpoint's weights
and preprocessing, gives new drivers new rows, grows the training area, records its lineage, and refuses in one line
what cannot be warm-started."""
import json

import numpy as np
import pytest
import torch

from conftest import one_line_error, random_trips
from stfast.cli import main
from stfast.data.coverage import TrainingArea
from stfast.data.dataset import NormStats
from stfast.models import members
from stfast.models.deeptte import local_count, training_loss
from stfast.train import checkpoint as ckpt
from stfast.train.config import TrainConfig
from stfast.train.run_data import predict
from stfast.train.trained import load_model
from stfast.train.trainer import Trainer
from stfast.train.warm_start import file_sha256

BASE = dict(format="deeptte", epochs=1, batch_size=16, seed=3, progress=False, threads=1)
FLAGS = ["--format", "deeptte", "--batch-size", "16", "--seed", "3", "--no-progress", "--threads", "1"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Trips of 8 drivers and a paper-preset model trained on them (one epoch); trips of the same area with 4 more
    drivers; trips 1° of longitude away; a float64 model stopped after one step."""
    d = tmp_path_factory.mktemp("warm")
    old, new, far = d / "old.jsonl", d / "new.jsonl", d / "far.jsonl"
    random_trips(120, seed=21, max_len=25).to_jsonl(old)
    random_trips(120, seed=22, max_len=25, n_drivers=12).to_jsonl(new)
    t = random_trips(60, seed=23, max_len=25)
    t.lng[:] = np.asarray(t.lng) + 1.0
    t.to_jsonl(far)
    Trainer(TrainConfig(data=str(old), out=str(d / "parent"), preset="paper", **BASE)).fit()
    Trainer(TrainConfig(data=str(old), out=str(d / "parent64"), preset="paper", precision="64", max_steps=1,
                        **BASE)).fit()
    return d


def warm(runs, out, data="new.jsonl", **kw):
    return Trainer(TrainConfig(data=str(runs / data), out=str(out), init_from=str(runs / "parent" / "checkpoint.pt"),
                               **{**BASE, **kw}))


def test_on_the_same_data_it_starts_with_the_checkpoint_weights(runs, tmp_path):
    parent = ckpt.load(runs / "parent" / "checkpoint.pt")
    tr = warm(runs, tmp_path, data="old.jsonl")
    own = tr.model.state_dict()
    assert sorted(own) == sorted(parent["model_state"])
    for k, v in parent["model_state"].items():
        assert torch.equal(own[k], v), k
    assert tr.cfg.preset == "paper" and tr.cfg.hidden_size == parent["model_config"]["hidden_size"]
    # predictions before training are the checkpoint's
    m = load_model(runs / "parent" / "checkpoint.pt")
    assert np.array_equal(predict(tr.model, tr.data.test_ds), m.predict(tr.data.test))
    # the first step's loss is the old model's loss on that batch
    gb = tr.data.epoch_batches(tr.cfg.batch_size, tr.cfg.seed, 0)[0]
    b = tr.data.train_ds.batch(gb)
    m.model.train()
    want = training_loss(m.model, m.model(b), b, len(gb), local_count(tr.data.train_ds.lengths[gb], 3)).item()
    assert float(tr.train_step(gb, use_local=True)) == pytest.approx(want, rel=1e-6)


def test_known_drivers_keep_their_rows_new_drivers_get_fresh_ones(runs, tmp_path):
    parent = ckpt.load(runs / "parent" / "checkpoint.pt")
    tr = warm(runs, tmp_path)
    old = parent["drivers"]
    vocab = tr.data.vocab.to_list()
    assert vocab[:len(old)] == old and sorted(vocab[len(old):]) == ["d10", "d11", "d8", "d9"]
    assert (tr.data.vocab.encode(["d9", "d0"]) > 0).all()
    w, was = tr.model.attr.driver.weight.detach(), parent["model_state"]["attr.driver.weight"]
    assert w.shape[0] == len(old) + 5 and torch.equal(w[:len(old) + 1], was)  # + the unseen driver's row 0
    torch.manual_seed(tr.cfg.seed)  # the rows a fresh model of this size starts with
    fresh = members.build(tr.data.model_config, tr.data.stats)
    assert torch.equal(w[len(old) + 1:], fresh.attr.driver.weight.detach()[len(old) + 1:])
    assert tr.data.warm["drivers_new"] == 4


def test_normalization_statistics_carried_or_refit(runs, tmp_path):
    parent = ckpt.load(runs / "parent" / "checkpoint.pt")
    tr = warm(runs, tmp_path / "kept")
    assert tr.data.stats.to_dict() == parent["norm_stats"]
    assert torch.equal(tr.model.time_mean, parent["model_state"]["time_mean"])  # the model's buffers too
    tr.release_out_dir()
    tr = warm(runs, tmp_path / "refit", refit_stats=True)
    new = NormStats.from_trips(tr.data.train, 3)
    assert tr.data.stats == new and new.time_mean != parent["norm_stats"]["time_mean"]
    assert tr.model.time_mean.item() == pytest.approx(new.time_mean, rel=1e-6) != parent["norm_stats"]["time_mean"]
    assert tr.model.lng_std.item() == pytest.approx(new.lng_std, rel=1e-6)
    assert torch.equal(tr.model.entire.out.weight, parent["model_state"]["entire.out.weight"])  # the weights kept


def test_the_training_area_grows_by_the_new_cells():
    old = TrainingArea.from_points(np.array([104.0, 104.02]), np.array([30.6, 30.61]))
    grown = old.extended(lambda: iter([(np.array([103.95, 104.0]), np.array([30.55, 30.6]))]))
    assert (grown.cell_lng, grown.cell_lat) == (old.cell_lng, old.cell_lat)
    assert grown.covers(np.array([104.0, 104.02, 103.95]), np.array([30.6, 30.61, 30.55])).all()
    assert len(grown.cells) == len(old.cells) + 1 and grown.cells.min() >= 0  # the origin moved south-west
    assert grown.bbox == (103.95, 30.55, 104.02, 30.61)
    same = old.extended(lambda: iter([(np.array([104.0]), np.array([30.6]))]))
    assert np.array_equal(same.cells, old.cells) and same.lng0 == old.lng0


def test_cli_warm_start_records_its_lineage_and_the_report_shows_it(runs, tmp_path, capsys):
    parent = runs / "parent" / "checkpoint.pt"
    child = tmp_path / "child"
    assert main(["train", "--init-from", str(parent), "--data", str(runs / "new.jsonl"), "--out", str(child),
                 "--epochs", "1", *FLAGS]) == 0
    out = capsys.readouterr().out
    s = json.loads((child / "summary.json").read_text())
    sha = file_sha256(parent)
    assert s["parent"] == {"path": str(parent.resolve()), "sha256": sha, "parent": None}
    assert f"sha256 {sha}" in out and f"training area: {s['warm_start']['cells']} cells, " \
                                      f"{s['warm_start']['cells_new']} new" in out
    assert s["warm_start"]["drivers_new"] == 4 and s["warm_start"]["cells_new"] > 0
    for name in ("checkpoint.pt", "last.pt"):
        assert ckpt.load(child / name)["parent"] == s["parent"]
    assert ckpt.load(parent)["parent"] is None  # a run from scratch has none
    assert main(["report", str(child)]) == 0
    page = (child / "report.html").read_text()
    assert "parent checkpoint" in page and sha in page
    # a grandchild knows the whole line
    grand = Trainer(TrainConfig(data=str(runs / "new.jsonl"), out=str(tmp_path / "grand"), max_steps=1,
                                init_from=str(child / "checkpoint.pt"), **BASE))
    s2 = grand.fit()
    assert s2["parent"]["sha256"] == file_sha256(child / "checkpoint.pt") and s2["parent"]["parent"] == s["parent"]


@pytest.mark.parametrize("extra, text", [
    (["--hidden-size", "64"], "is another model: --hidden-size 128 in the checkpoint, 64 now"),
    (["--preset", "real"], "was trained with --preset paper, not real"),
    (["--driver-dim", "8"], "--driver-dim 16 in the checkpoint, 8 now"),
    (["--min-spacing-km", "0.5"], "--min-spacing-km 0.5 differs from the checkpoint's 0.2"),
    (["--resume"], "--init-from starts a new run from another run's checkpoint, --resume continues"),
    (["--data", "far.jsonl"], "lie outside the training area of --init-from"),
    (["--init-from", "parent64/checkpoint.pt", "--precision", "32"], "holds float64 weights (--precision 64)"),
    (["--out", "parent"], "is inside --out"),
], ids=["hidden-size", "preset", "driver-dim", "preprocessing", "resume", "outside", "precision", "inside-out"])
def test_what_cannot_be_warm_started_is_refused_in_one_line(runs, tmp_path, capsys, extra, text):
    argv = ["train", "--init-from", str(runs / "parent" / "checkpoint.pt"), "--data", str(runs / "new.jsonl"),
            "--out", str(tmp_path / "o"), *FLAGS]
    for flag in ("--data", "--init-from", "--out"):  # given again: the value, under the runs' folder
        if flag in extra:
            i = extra.index(flag)
            argv[argv.index(flag) + 1] = str(runs / extra[i + 1])
            extra = extra[:i] + extra[i + 2:]
    err = one_line_error(capsys, main(argv + extra))
    assert text in err, err
    assert not (tmp_path / "o" / "checkpoint.pt").exists()


def test_allow_outside_trains_on_data_outside_the_area_and_grows_it(runs, tmp_path):
    tr = warm(runs, tmp_path, data="far.jsonl", allow_outside=True)
    assert tr.data.warm["cells_new"] > 0
    assert TrainingArea.from_dict(tr.data.route_profile["area"]).covers(np.array([104.06 + 1.0]), np.array([30.66]))


def test_the_warm_start_flags_alone_are_refused():
    with pytest.raises(ValueError, match="--refit-stats applies to a warm start"):
        TrainConfig(refit_stats=True).validate()
    with pytest.raises(ValueError, match="--allow-outside applies to a warm start"):
        TrainConfig(allow_outside=True).validate()


def test_a_warm_run_resumes_with_its_lineage_area_and_parent_preprocessing(runs, tmp_path):
    """--resume of a warm-started run: its parent's preprocessing (here --min-spacing-km 0, not given again), grown
    area and lineage continue; load_model reads the lineage back."""
    p0, child = tmp_path / "p0", tmp_path / "child"
    Trainer(TrainConfig(data=str(runs / "old.jsonl"), out=str(p0), preset="paper", min_spacing_km=0.0, max_steps=1,
                        **BASE)).fit()
    first = Trainer(TrainConfig(data=str(runs / "new.jsonl"), out=str(child), init_from=str(p0 / "checkpoint.pt"),
                                max_steps=1, **{**BASE, "epochs": 2}))
    assert first.cfg.min_spacing_km == 0.0
    first.fit()
    area = ckpt.load(child / "last.pt")["route_profile"]["area"]
    s = Trainer(TrainConfig(data=str(runs / "new.jsonl"), out=str(child), resume=True, max_steps=2,
                            **{**BASE, "epochs": 2})).fit()
    assert s["parent"]["sha256"] == file_sha256(p0 / "checkpoint.pt")
    last = ckpt.load(child / "last.pt")
    assert last["step"] == 2 and last["route_profile"]["area"] == area
    assert load_model(child / "checkpoint.pt").parent == s["parent"]
