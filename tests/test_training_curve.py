"""A pinned float64 training curve on the synthetic city: the per-step losses, the epoch rows' losses and
validation metrics, the test metrics, and the key sets of the checkpoint and of each metrics.jsonl row
type, recorded on main at 84bcac9 (before the trainer's redesign, issue 23) and reproduced since. The
checkpoint's key set has since gained the options of issues 25 and 22 (train_config.preset, .week, .swa_start,
.select, .hidden_size, .members, .subtrips, .subtrips_resample, .accum_start and model_config.week, .members;
issue 44's train_config.precision and gemm_plan; issue 51's train_config.compile), added by hand: the synthetic city's preset is paper, the numbers are 84bcac9's.

Regenerate (only for an intended change of the numbers, saying why in the commit):
    PYTHONPATH=$PWD python tests/test_training_curve.py
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import stfast.train.guards as guards
from stfast.train import checkpoint as ckpt
from stfast.train.config import TrainConfig
from stfast.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
REL = 1e-10
BASE = dict(data=None, n_synthetic=60, dtype="float64", batch_size=8, epochs=2, seed=3, progress=False, threads=1)
CASES = {  # name → TrainConfig fields on top of BASE
    "plain": {},
    "accumulation_k2": {"accumulation": "fixed:2", "accum_window": 2},
    "bad_step": {"max_steps": 5},  # the 3rd optimizer step is declared non-finite (skipped, a bad_step row)
}
CLI_2_RANKS = ["train", "--n-synthetic", "60", "--dtype", "float64", "--batch-size", "8", "--epochs", "2",
               "--seed", "3", "--threads", "1", "--no-progress", "--nproc", "2", "--accumulation", "fixed:1"]


def key_paths(d, prefix="") -> list[str]:
    """Every key of a nested dict as a dotted path (lists and tensors are leaves)."""
    out = []
    for k, v in d.items():
        p = f"{prefix}{k}"
        out.append(p)
        if isinstance(v, dict):
            out += key_paths(v, p + ".")
    return sorted(out)


def rows_by_type(out: Path) -> dict[str, list[dict]]:
    rows: dict[str, list[dict]] = {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        rows.setdefault(r["type"], []).append(r)
    return rows


def observe(out: Path, rows: dict, summary: dict, losses: list[float] | None) -> dict:
    st = ckpt.load(out / "last.pt")
    return {
        "losses": losses,
        "epochs": [{k: r[k] for k in ("epoch", "step", "train_loss", "val_mape", "val_mae", "val_rmse", "lr")}
                   for r in rows.get("epoch", [])],
        "test": {k: summary.get(k) for k in ("test_mape", "test_mae", "test_rmse", "best_val_mape", "steps", "epochs")},
        "checkpoint_keys": [p for p in key_paths(st) if not p.startswith(("optimizer_state.state.", "rng."))],
        "row_keys": {t: sorted(set().union(*map(set, rs))) for t, rs in sorted(rows.items())},
    }


def run_case(name: str, out: Path, monkeypatch=None) -> dict:
    tr = Trainer(TrainConfig(**BASE, **CASES[name], out=str(out)))
    losses: list[float] = []
    orig = tr.train_step

    def spy(gb, use_local):
        loss = orig(gb, use_local)
        losses.append(loss)
        return loss

    tr.train_step = spy
    if name == "bad_step":
        calls = {"n": 0}
        real = guards.BadStepGuard.problem

        def problem(reduced_loss, grad_sq):
            calls["n"] += 1
            return "non-finite loss" if calls["n"] == 3 else real(reduced_loss, grad_sq)

        monkeypatch.setattr(guards.BadStepGuard, "problem", staticmethod(problem))
    summary = tr.fit()
    return observe(out, rows_by_type(out), summary, losses)


def run_two_ranks(out: Path) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "stfast.cli", *CLI_2_RANKS, "--out", str(out)], capture_output=True,
                       text=True, env=env, timeout=600, check=False)
    assert r.returncode == 0, r.stderr + r.stdout
    rows = rows_by_type(out)
    got = observe(out, rows, json.loads((out / "summary.json").read_text()), None)
    # the shards depend on measured times (the slicer's cost model); their totals do not
    got["step_trips"] = [sum(r["shard_trips"]) for r in rows["step"]]
    # a step row's epoch is the one it is in, numbered from 1 as the epoch rows are
    assert {r["epoch"] for r in rows["step"]} == {r["epoch"] for r in rows["epoch"]}
    return got


def assert_close(got, want, where="") -> None:
    if isinstance(want, float):
        assert got == pytest.approx(want, rel=REL, abs=1e-300), where
    elif isinstance(want, dict):
        assert sorted(got) == sorted(want), where
        for k in want:
            assert_close(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            assert_close(g, w, f"{where}[{i}]")
    else:
        assert got == want, where


# the key sets (every case: those of its row types)
CHECKPOINT_KEYS = sorted(['accumulation', 'accumulation.k', 'accumulation.loss_ema', 'accumulation.n_windows', 'accumulation.noise',
 'accumulation.noise.decay', 'accumulation.noise.g2_ema', 'accumulation.noise.g2_sq_ema', 'accumulation.noise.n',
 'accumulation.noise.trace_ema', 'accumulation.noise_kind', 'accumulation.scheduler', 'accumulation.scheduler.k',
 'accumulation.wall_before', 'accumulation.window', 'accumulation.window.w_comm', 'accumulation.window.w_compute',
 'accumulation.window.w_loss_start', 'accumulation.window.w_steps', 'accumulation.window.w_trips',
 'accumulation.window.w_wall', 'best_val_mape', 'data_fingerprint', 'drivers', 'ema_state', 'epoch', 'epoch_batch',
 'epoch_progress', 'metrics_bytes', 'model_config', 'model_config.alpha', 'model_config.compat',
 'model_config.conv_channels', 'model_config.driver_dim', 'model_config.dropout', 'model_config.geo_hidden',
 'model_config.head', 'model_config.hidden_size', 'model_config.kernel_size', 'model_config.kernels',
 'model_config.local_hidden', 'model_config.loss', 'model_config.members', 'model_config.n_drivers', 'model_config.n_residual',
 'model_config.num_layers', 'model_config.state_dim', 'model_config.time_bin_min', 'model_config.time_dim',
 'model_config.week', 'model_config.week_dim', 'model_state', 'model_state.attention.attr_proj.bias',
 'model_state.attention.attr_proj.weight', 'model_state.attr.driver.weight', 'model_state.attr.time.weight',
 'model_state.attr.week.weight', 'model_state.dist_mean', 'model_state.dist_std', 'model_state.entire.inp.bias',
 'model_state.entire.inp.weight', 'model_state.entire.out.bias', 'model_state.entire.out.weight',
 'model_state.entire.res.0.bias', 'model_state.entire.res.0.weight', 'model_state.entire.res.1.bias',
 'model_state.entire.res.1.weight', 'model_state.entire.res.2.bias', 'model_state.entire.res.2.weight',
 'model_state.lat_mean', 'model_state.lat_std', 'model_state.lng_mean', 'model_state.lng_std',
 'model_state.local.hidden.0.bias', 'model_state.local.hidden.0.weight', 'model_state.local.hidden.1.bias',
 'model_state.local.hidden.1.weight', 'model_state.local.out.bias', 'model_state.local.out.weight',
 'model_state.local_dist_mean', 'model_state.local_dist_std', 'model_state.local_time_mean',
 'model_state.local_time_std', 'model_state.spatio_temporal.geo_conv.conv.bias',
 'model_state.spatio_temporal.geo_conv.conv.weight', 'model_state.spatio_temporal.geo_conv.proj.bias',
 'model_state.spatio_temporal.geo_conv.proj.weight', 'model_state.spatio_temporal.geo_conv.state_em.weight',
 'model_state.spatio_temporal.lstm.bias_hh_l0', 'model_state.spatio_temporal.lstm.bias_hh_l1',
 'model_state.spatio_temporal.lstm.bias_ih_l0', 'model_state.spatio_temporal.lstm.bias_ih_l1',
 'model_state.spatio_temporal.lstm.weight_hh_l0', 'model_state.spatio_temporal.lstm.weight_hh_l1',
 'model_state.spatio_temporal.lstm.weight_ih_l0', 'model_state.spatio_temporal.lstm.weight_ih_l1',
 'model_state.speed_km_s', 'model_state.time_mean', 'model_state.time_std', 'n_trips', 'norm_stats',
 'norm_stats.dist_mean', 'norm_stats.dist_std', 'norm_stats.kernel_size', 'norm_stats.lat_mean',
 'norm_stats.lat_std', 'norm_stats.lng_mean', 'norm_stats.lng_std', 'norm_stats.local_dist_mean',
 'norm_stats.local_dist_std', 'norm_stats.local_time_mean', 'norm_stats.local_time_std', 'norm_stats.speed_km_s',
 'norm_stats.time_mean', 'norm_stats.time_std', 'optimizer_state', 'optimizer_state.param_groups',
 'optimizer_state.state', 'preprocess_config', 'preprocess_config.gap_s', 'preprocess_config.max_points',
 'preprocess_config.max_speed_kmh', 'preprocess_config.min_dist_km', 'preprocess_config.min_points',
 'preprocess_config.min_spacing_km', 'preprocess_config.min_time_s', 'preprocess_config.modes',
 'preprocess_config.stay_min_s', 'preprocess_config.stay_radius_m', 'preprocess_config.tz', 'rng',
 'slicer_cost_model', 'gemm_plan', 'parent', 'step', 'stfast_version', 'train_config', 'train_config.allow_outside', 'train_config.init_from', 'train_config.refit_stats', 'train_config.accum_start', 'train_config.accum_window',
 'train_config.accumulation', 'train_config.alpha', 'train_config.batch_size', 'train_config.checkpoint_every',
 'train_config.columns', 'train_config.comm', 'train_config.compat', 'train_config.compile', 'train_config.cp_plan', 'train_config.data', 'train_config.data_seed',
 'train_config.device', 'train_config.driver_dim', 'train_config.dropout', 'train_config.dtype',
 'train_config.ema_decay', 'train_config.ensemble', 'train_config.epochs', 'train_config.format',
 'train_config.gap_s', 'train_config.head', 'train_config.hidden_size', 'train_config.kernels', 'train_config.loss', 'train_config.lr',
 'train_config.lr_scaling', 'train_config.lr_schedule', 'train_config.max_bad_steps', 'train_config.max_steps', 'train_config.members',
 'train_config.micro_batches', 'train_config.min_spacing_km', 'train_config.modes', 'train_config.n_synthetic',
 'train_config.noise_scale', 'train_config.nproc', 'train_config.on_error', 'train_config.out',
 'train_config.overwrite', 'train_config.parallel', 'train_config.patience', 'train_config.precision', 'train_config.preset', 'train_config.progress',
 'train_config.resume', 'train_config.seed', 'train_config.select', 'train_config.slicer', 'train_config.split',
 'train_config.split_by',
 'train_config.split_days', 'train_config.subtrips', 'train_config.subtrips_resample', 'train_config.swa_start', 'train_config.threads', 'train_config.time_bin_min',
 'train_config.time_budget_s',
 'train_config.timeout_s', 'train_config.tz', 'train_config.week', 'train_config.weight_decay', 'tz'] + [
    # what ETA of planned routes needs of the training split (issue 40): area, default state, spacing
    'route_profile', 'route_profile.area', 'route_profile.area.bbox', 'route_profile.area.cell_km',
    'route_profile.area.cell_lat', 'route_profile.area.cell_lng', 'route_profile.area.cells', 'route_profile.area.lat0',
    'route_profile.area.lng0', 'route_profile.area.margin_cells', 'route_profile.n_points', 'route_profile.spacing_km',
    'route_profile.state', 'route_profile.state_share'])
CHECKPOINT_KEYS_2_RANKS = sorted(CHECKPOINT_KEYS + ['slicer_cost_model.coefficients', 'slicer_cost_model.features', 'slicer_cost_model.fit_error',
 'slicer_cost_model.fit_error.n_obs', 'slicer_cost_model.fit_error.rel_median',
 'slicer_cost_model.fit_error.rel_rmse', 'slicer_cost_model.fit_error.stderr',
 'slicer_cost_model.fit_error.step_factor_spread', 'slicer_cost_model.group_factors', 'slicer_cost_model.groups',
 'slicer_cost_model.min_obs', 'slicer_cost_model.next_group', 'slicer_cost_model.per_step_scale',
 'slicer_cost_model.seconds', 'slicer_cost_model.window'])
ROW_KEYS = {'epoch': ['epoch', 'lr', 'samples_per_s', 'step', 'train_loss', 'type', 'val_mae', 'val_mape', 'val_rmse',
           'wall_s'],
 'window': ['accumulation', 'budget_used', 'comm_s', 'comm_share', 'imbalance', 'k', 'k_next', 'loss_ema',
            'loss_slope', 'micro_batch', 'noise_kind', 'noise_scale', 'noise_scale_point', 'overhead_s',
            'samples_per_s', 'step', 'steps', 'steps_per_s', 'trips', 'type', 'wall_s', 'window', 'window_s'],
 'bad_step': ['at_batch', 'at_epoch', 'bad_step', 'loss', 'reason', 'type'],
 'step': ['compute_s', 'cost_coef', 'cost_fit_error', 'data_s', 'epoch', 'idle_s', 'imbalance_measured',
          'imbalance_predicted', 'shard_points', 'shard_trips', 'slicer', 'step', 'step_s', 'type']}

EXPECTED: dict = {  # recorded on main at 84bcac9
    'plain': dict(
        losses=[0.9017041076483743, 0.3498354255599654, 0.2550011917068166, 0.09032584726756612, 0.28767030775633234,
         0.19602822068960038, 0.1264000631801337, 0.10817714229849898, 0.22622496357128358, 0.16022920021690357,
         0.1489264659193459, 0.34147084474627615],
        epochs=[{'epoch': 1,
          'step': 6,
          'train_loss': 0.34676085010477586,
          'val_mape': 0.3062690059813895,
          'val_mae': 354.08640998450755,
          'val_rmse': 416.71188423163886,
          'lr': 0.001},
         {'epoch': 2,
          'step': 12,
          'train_loss': 0.18523811332207363,
          'val_mape': 0.31818014221460655,
          'val_mae': 299.8837582912176,
          'val_rmse': 347.4820405596596,
          'lr': 0.001}],
        test={'test_mape': 0.3173837010314545,
         'test_mae': 792.1335553657134,
         'test_rmse': 1106.4301679169043,
         'best_val_mape': 0.3062690059813895,
         'steps': 12,
         'epochs': 2},
        checkpoint_keys=CHECKPOINT_KEYS, row_keys={t: ROW_KEYS[t] for t in ['epoch', 'window']}),
    'accumulation_k2': dict(
        losses=[0.7739620391029474, 0.1876146017396457, 0.27722787663453907, 0.11741708312637744, 0.31040384636281626,
         0.19208172156610523],
        epochs=[{'epoch': 1,
          'step': 3,
          'train_loss': 0.4129348391590441,
          'val_mape': 0.338443656270102,
          'val_mae': 425.2149223827381,
          'val_rmse': 517.6815923508738,
          'lr': 0.0014142135623730952},
         {'epoch': 2,
          'step': 6,
          'train_loss': 0.206634217018433,
          'val_mape': 0.30985541799723904,
          'val_mae': 323.4684868457417,
          'val_rmse': 367.86416733656137,
          'lr': 0.0014142135623730952}],
        test={'test_mape': 0.29626409886752547,
         'test_mae': 712.2402056144227,
         'test_rmse': 994.2847177292748,
         'best_val_mape': 0.30985541799723904,
         'steps': 6,
         'epochs': 2},
        checkpoint_keys=CHECKPOINT_KEYS, row_keys={t: ROW_KEYS[t] for t in ['epoch', 'window']}),
    'bad_step': dict(
        losses=[0.9017041076483743, 0.3498354255599654, 0.2550011917068166, 0.1112948439658018, 0.2582408036328313,
         0.12580295394752222],
        epochs=[{'epoch': 1,
          'step': 5,
          'train_loss': 0.349375626950899,
          'val_mape': 0.4407393026734127,
          'val_mae': 412.5389310399162,
          'val_rmse': 469.29484017555694,
          'lr': 0.001}],
        test={'test_mape': 0.39734409895711176,
         'test_mae': 797.6747366898245,
         'test_rmse': 1026.9003820042933,
         'best_val_mape': 0.4407393026734127,
         'steps': 5,
         'epochs': 1},
        checkpoint_keys=CHECKPOINT_KEYS, row_keys={t: ROW_KEYS[t] for t in ['bad_step', 'epoch']}),
    'two_ranks': dict(
        losses=None,
        epochs=[{'epoch': 1,
          'step': 6,
          'train_loss': 0.34676085010477586,
          'val_mape': 0.30626900598138956,
          'val_mae': 354.0864099845076,
          'val_rmse': 416.71188423163886,
          'lr': 0.001},
         {'epoch': 2,
          'step': 12,
          'train_loss': 0.18523811332207366,
          'val_mape': 0.31818014221460655,
          'val_mae': 299.88375829121753,
          'val_rmse': 347.4820405596596,
          'lr': 0.001}],
        test={'test_mape': 0.3173837010314545,
         'test_mae': 792.1335553657134,
         'test_rmse': 1106.430167916904,
         'best_val_mape': 0.30626900598138956,
         'steps': 12,
         'epochs': 2},
        step_trips=[8, 2, 8, 8, 8, 8, 8, 8, 8, 2, 8, 8],
        checkpoint_keys=CHECKPOINT_KEYS_2_RANKS, row_keys={t: ROW_KEYS[t] for t in ['epoch', 'step', 'window']}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_training_curve_is_reproduced(name, tmp_path, monkeypatch):
    assert_close(run_case(name, tmp_path, monkeypatch), EXPECTED[name], name)


@pytest.mark.slow
def test_two_rank_training_curve_is_reproduced(tmp_path):
    assert_close(run_two_ranks(tmp_path / "two"), EXPECTED["two_ranks"], "two_ranks")


if __name__ == "__main__":  # print the recording
    import tempfile

    class _Patch:
        def setattr(self, obj, name, value):
            setattr(obj, name, value)

    rec = {}
    with tempfile.TemporaryDirectory() as d:
        for name in CASES:
            real = guards.BadStepGuard.problem
            rec[name] = run_case(name, Path(d) / name, _Patch())
            guards.BadStepGuard.problem = staticmethod(real)
        rec["two_ranks"] = run_two_ranks(Path(d) / "two")
    print(json.dumps(rec, indent=1))
