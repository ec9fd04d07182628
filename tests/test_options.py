"""The command line's options and TrainConfig's defaults, pinned: recorded from main (84bcac9) before
the options were declared once (stfast.train.config), so that deriving the parser from the
declarations changes no flag, default, choice or destination, and the flags reach the same
TrainConfig fields as the hand-written mapping did.

Since issue 25 (stfast.train.presets) the options a --preset fills (presets.FIELDS: --epochs, --lr,
--weight-decay, --head, --loss, --dropout, --driver-dim, --time-bin-min and the new --week, --swa-start,
--select) have the flag default None, "not given", and TrainConfig fills them when it is built; the
synthetic city's preset is paper, so TrainConfig()'s values are 84bcac9's defaults still. New flags:
--preset, --swa-start, --select, --week; and the preset fields --hidden-size, --members
(stfast.models.members) since; --compile (issue 51: off unless given, on --resume the run's), and its --no-compile (off, also on --resume); the warm start's --init-from, --refit-stats and --allow-outside
(issue 63, stfast.train.warm_start)."""
import argparse
import dataclasses
import re
import shlex

import pytest

import stfast.cli as cli
from stfast.cli import build_parser
from stfast.train.config import TrainConfig

PARSERS = {  # subcommand → {dest: (option strings, default, choices, type, action, required, nargs)}
    'train': {
        'data': (('--data',), None, None, None, 'StoreAction', False, None),
        'format': (('--format',), 'auto', ('auto', 'synthetic', 'deeptte', 'geolife', 'didi', 'csv', 'porto', 'tdrive', 'parquet'), None, 'StoreAction', False, None),
        'on_error': (('--on-error',), 'raise', ('raise', 'skip'), None, 'StoreAction', False, None),
        'columns': (('--columns',), None, None, None, 'StoreAction', False, None),
        'modes': (('--modes',), '', None, None, 'StoreAction', False, None),
        'min_spacing_km': (('--min-spacing-km',), 0.2, None, 'float', 'StoreAction', False, None),
        'gap_min': (('--gap-min',), 20.0, None, 'float', 'StoreAction', False, None),
        'tz': (('--tz',), None, None, None, 'StoreAction', False, None),
        'n_synthetic': (('--n-synthetic',), 20000, None, 'int', 'StoreAction', False, None),
        'preset': (('--preset',), 'auto', ('auto', 'real', 'paper'), None, 'StoreAction', False, None),
        'epochs': (('--epochs',), None, None, 'int', 'StoreAction', False, None),
        'batch_size': (('--batch-size',), 64, None, 'int', 'StoreAction', False, None),
        'lr': (('--lr',), None, None, 'float', 'StoreAction', False, None),
        'weight_decay': (('--weight-decay',), None, None, 'float', 'StoreAction', False, None),
        'subtrips': (('--subtrips',), None, None, 'int', 'StoreAction', False, None),
        'subtrips_resample': (('--subtrips-resample',), None, ('once', 'epoch'), None, 'StoreAction', False, None),
        'lr_schedule': (('--lr-schedule',), 'constant', ('constant', 'cosine'), None, 'StoreAction', False, None),
        'ema_decay': (('--ema-decay',), None, None, 'float', 'StoreAction', False, None),
        'swa_start': (('--swa-start',), None, None, "float or 'none'", 'StoreAction', False, None),
        'select': (('--select',), None, ('best', 'last'), None, 'StoreAction', False, None),
        'alpha': (('--alpha',), 0.3, None, 'float', 'StoreAction', False, None),
        'compat': (('--compat',), 'fixed', ('fixed', 'original'), None, 'StoreAction', False, None),
        'head': (('--head',), None, ('paper', 'prior'), None, 'StoreAction', False, None),
        'loss': (('--loss',), None, ('mape', 'log', 'mae'), None, 'StoreAction', False, None),
        'dropout': (('--dropout',), None, None, 'float', 'StoreAction', False, None),
        'driver_dim': (('--driver-dim',), None, None, 'int', 'StoreAction', False, None),
        'time_bin_min': (('--time-bin-min',), None, None, 'int', 'StoreAction', False, None),
        'week': (('--week',), None, ('day', 'weekend'), None, 'StoreAction', False, None),
        'hidden_size': (('--hidden-size',), None, None, 'int', 'StoreAction', False, None),
        'members': (('--members',), None, None, 'int', 'StoreAction', False, None),
        'kernels': (('--kernels',), 'fused', ('fused', 'reference'), None, 'StoreAction', False, None),
        'patience': (('--patience',), None, None, 'int', 'StoreAction', False, None),
        'nproc': (('--nproc',), 1, None, 'int', 'StoreAction', False, None),
        'comm': (('--comm',), 'torch', ('torch', 'nccl'), None, 'StoreAction', False, None),
        'slicer': (('--slicer',), None, ('balanced', 'equal', 'sorted'), None, 'StoreAction', False, None),
        'threads': (('--threads',), None, None, 'int', 'StoreAction', False, None),
        'device': (('--device',), 'cpu', None, None, 'StoreAction', False, None),
        'precision': (('--precision',), None, ('32', '64', 'bf16-mixed'), None, 'StoreAction', False, None),
        'dtype': (('--dtype',), None, ('float32', 'float64'), None, 'StoreAction', False, None),
        'seed': (('--seed',), 0, None, 'int', 'StoreAction', False, None),
        'data_seed': (('--data-seed',), None, None, 'int', 'StoreAction', False, None),
        'ensemble': (('--ensemble',), 1, None, 'int', 'StoreAction', False, None),
        'split': (('--split',), '0.7/0.15/0.15', None, None, 'StoreAction', False, None),
        'split_by': (('--split-by',), 'random', ('random', 'date'), None, 'StoreAction', False, None),
        'split_days': (('--split-days',), None, None, None, 'StoreAction', False, None),
        'max_steps': (('--max-steps',), None, None, 'int', 'StoreAction', False, None),
        'compile': (('--compile', '--no-compile'), None, None, None, 'BooleanOptionalAction', False, 0),
        'out': (('--out',), 'runs/latest', None, None, 'StoreAction', False, None),
        'resume': (('--resume',), False, None, None, 'StoreTrueAction', False, 0),
        'overwrite': (('--overwrite',), False, None, None, 'StoreTrueAction', False, 0),
        'init_from': (('--init-from',), None, None, None, 'StoreAction', False, None),
        'refit_stats': (('--refit-stats',), False, None, None, 'StoreTrueAction', False, 0),
        'allow_outside': (('--allow-outside',), False, None, None, 'StoreTrueAction', False, 0),
        'no_progress': (('--no-progress',), False, None, None, 'StoreTrueAction', False, 0),
        'accumulation': (('--accumulation',), None, None, None, 'StoreAction', False, None),
        'accum_window': (('--accum-window',), 10, None, 'int', 'StoreAction', False, None),
        'accum_start': (('--accum-start',), 1, None, 'int', 'StoreAction', False, None),
        'lr_scaling': (('--lr-scaling',), 'sqrt', ('sqrt', 'linear', 'none'), None, 'StoreAction', False, None),
        'noise_scale': (('--noise-scale',), None, ('adam', 'plain'), None, 'StoreAction', False, None),
        'time_budget': (('--time-budget',), None, None, 'float', 'StoreAction', False, None),
        'checkpoint_every': (('--checkpoint-every',), None, None, 'int', 'StoreAction', False, None),
        'max_bad_steps': (('--max-bad-steps',), 5, None, 'int', 'StoreAction', False, None),
        'timeout_s': (('--timeout-s',), 300.0, None, 'float', 'StoreAction', False, None),
        'parallel': (('--parallel',), 'dp', ('dp', 'cp', 'dp+cp'), None, 'StoreAction', False, None),
        'micro_batches': (('--micro-batches',), None, None, 'int', 'StoreAction', False, None),
        'cp_plan': (('--cp-plan',), 'components', ('components', 'layers'), None, 'StoreAction', False, None),
    },
    'evaluate': {
        'checkpoint': (('--checkpoint',), None, None, None, 'StoreAction', True, '+'),
        'data': (('--data',), None, None, None, 'StoreAction', False, None),
        'format': (('--format',), None, ('auto', 'synthetic', 'deeptte', 'geolife', 'didi', 'csv', 'porto', 'tdrive', 'parquet'), None, 'StoreAction', False, None),
        'on_error': (('--on-error',), None, ('raise', 'skip'), None, 'StoreAction', False, None),  # the run's, or raise
        'columns': (('--columns',), None, None, None, 'StoreAction', False, None),
        'modes': (('--modes',), None, None, None, 'StoreAction', False, None),
        'min_spacing_km': (('--min-spacing-km',), None, None, 'float', 'StoreAction', False, None),
        'gap_min': (('--gap-min',), None, None, 'float', 'StoreAction', False, None),
        'tz': (('--tz',), None, None, None, 'StoreAction', False, None),
        'split': (('--split',), None, ('all', 'train', 'val', 'test'), None, 'StoreAction', False, None),  # evaluate: test without --data
        # issue 52: data mostly outside the training area is refused without it
        'allow_outside': (('--allow-outside',), False, None, None, 'StoreTrueAction', False, 0),
        'device': (('--device',), 'cpu', None, None, 'StoreAction', False, None),
        'threads': (('--threads',), None, None, 'int', 'StoreAction', False, None),  # issue 53: every core
        'precision': (('--precision',), None, ('32', '64', 'bf16-mixed'), None, 'StoreAction', False, None),
    },
    'bench modes': {
        'data': (('--data',), None, None, None, 'StoreAction', False, None),
        'format': (('--format',), 'auto', ('auto', 'synthetic', 'deeptte', 'geolife', 'didi', 'csv', 'porto', 'tdrive', 'parquet'), None, 'StoreAction', False, None),
        'n_synthetic': (('--n-synthetic',), 3000, None, 'int', 'StoreAction', False, None),
        'nproc': (('--nproc',), 2, None, 'int', 'StoreAction', False, None),
        'threads': (('--threads',), None, None, 'int', 'StoreAction', False, None),
        'batch_size': (('--batch-size',), 64, None, 'int', 'StoreAction', False, None),
        'precision': (('--precision',), None, ('32', '64', 'bf16-mixed'), None, 'StoreAction', False, None),
        'budget_s': (('--budget-s',), 60.0, None, 'float', 'StoreAction', False, None),
        'target_mape': (('--target-mape',), None, None, 'float', 'StoreAction', False, None),
        'seeds': (('--seeds',), 1, None, 'int', 'StoreAction', False, None),
        'only': (('--only',), None, None, None, 'AppendAction', False, None),
        'reuse': (('--reuse',), False, None, None, 'StoreTrueAction', False, 0),
        'out': (('--out',), None, None, None, 'StoreAction', True, None),
    },
    'report': {
        'run_dir': (None, None, None, None, 'StoreAction', True, None),
        'out': (('--out',), None, None, None, 'StoreAction', False, None),
    },
    'serve': {
        'checkpoint': (('--checkpoint',), None, None, None, 'StoreAction', True, None),
        'host': (('--host',), '127.0.0.1', None, None, 'StoreAction', False, None),
        'port': (('--port',), 8000, None, 'int', 'StoreAction', False, None),
        'max_batch': (('--max-batch',), 64, None, 'int', 'StoreAction', False, None),
        'max_wait_ms': (('--max-wait-ms',), 5.0, None, 'float', 'StoreAction', False, None),
        'max_body_kb': (('--max-body-kb',), 1024, None, 'int', 'StoreAction', False, None),
        'rate_limit': (('--rate-limit',), 0.0, None, 'float', 'StoreAction', False, None),
        # issue 45: limits, trust and connections
        'max_route_points': (('--max-route-points',), 10000, None, 'int', 'StoreAction', False, None),
        'max_request_points': (('--max-request-points',), 20000, None, 'int', 'StoreAction', False, None),
        'max_batch_points': (('--max-batch-points',), 20000, None, 'int', 'StoreAction', False, None),
        'forwarded_allow_ips': (('--forwarded-allow-ips',), None, None, None, 'StoreAction', False, None),
        'token_file': (('--token-file',), None, None, None, 'StoreAction', False, None),
        'allowed_host': (('--allowed-host',), [], None, None, 'AppendAction', False, None),
        'cors_origin': (('--cors-origin',), [], None, None, 'AppendAction', False, None),
        'header_timeout_s': (('--header-timeout-s',), 10.0, None, 'float', 'StoreAction', False, None),
        'body_timeout_s': (('--body-timeout-s',), 30.0, None, 'float', 'StoreAction', False, None),
        'idle_timeout_s': (('--idle-timeout-s',), 30.0, None, 'float', 'StoreAction', False, None),
        'max_connections': (('--max-connections',), 1000, None, 'int', 'StoreAction', False, None),
        'drain_s': (('--drain-s',), 30.0, None, 'float', 'StoreAction', False, None),
        # issue 52 (a ready line, an access log) and 54 (limits per client, clients that do not read)
        'log_level': (('--log-level',), 'info', ('debug', 'info', 'warning', 'error'), None, 'StoreAction', False,
                      None),
        'access_log': (('--no-access-log',), True, None, None, 'StoreFalseAction', False, 0),
        'max_connections_per_client': (('--max-connections-per-client',), None, None, 'int', 'StoreAction', False,
                                       None),
        'write_timeout_s': (('--write-timeout-s',), 30.0, None, 'float', 'StoreAction', False, None),
        'watch': (('--watch',), False, None, None, 'StoreTrueAction', False, 0),
        'device': (('--device',), 'cpu', None, None, 'StoreAction', False, None),
        'threads': (('--threads',), None, None, 'int', 'StoreAction', False, None),
        'precision': (('--precision',), None, ('32', '64', 'bf16-mixed'), None, 'StoreAction', False, None),
    },
}
PARSERS["predict"] = {**PARSERS["evaluate"],
                      'out': (('--out',), None, None, None, 'StoreAction', True, None)}
PARSERS["data convert"] = {**{k: PARSERS["train"][k] for k in ("format", "on_error", "columns", "modes", "min_spacing_km", "gap_min",
                                                                "tz")},
                           'data': (('--data',), None, None, None, 'StoreAction', True, None),
                           # the trip filters: convert's alone (a store keeps them); None: PreprocessConfig's default
                           'min_points': (('--min-points',), None, None, 'int', 'StoreAction', False, None),
                           'min_time_s': (('--min-time-s',), None, None, 'float', 'StoreAction', False, None),
                           'min_dist_km': (('--min-dist-km',), None, None, 'float', 'StoreAction', False, None),
                           'out': (('--out',), None, None, None, 'StoreAction', True, None)}
PARSERS["data verify"] = {'store': (None, None, None, None, 'StoreAction', True, None)}
PARSERS["compare"] = {
    'candidate': (None, None, None, None, 'StoreAction', True, None),
    'incumbent': (None, None, None, None, 'StoreAction', True, None),
    'data': (('--data',), None, None, None, 'StoreAction', True, None),
    **{k: PARSERS["train"][k] for k in ("format", "on_error", "columns")},
    'min_gain': (('--min-gain',), 0.0, None, 'float', 'StoreAction', False, None),
    'promote': (('--promote',), None, None, None, 'StoreAction', False, None),
    'bootstrap_seed': (('--bootstrap-seed',), 0, None, 'int', 'StoreAction', False, None),
    'allow_outside': (('--allow-outside',), False, None, None, 'StoreTrueAction', False, 0),
    **{k: PARSERS["train"][k] for k in ("device", "threads")},
}

TRAIN_CONFIG = {  # TrainConfig's fields, in order, with their defaults
    'data': None,
    'format': 'auto',
    'n_synthetic': 20000,
    'on_error': 'raise',
    'columns': None,
    'modes': (),
    'min_spacing_km': 0.2,
    'gap_s': 1200.0,
    'tz': None,
    'preset': 'paper',  # resolved: auto is paper on the synthetic city
    'epochs': 10,
    'batch_size': 64,
    'lr': 0.001,
    'weight_decay': 0.0,
    'subtrips': 0,
    'subtrips_resample': 'once',
    'lr_schedule': 'constant',
    'ema_decay': None,
    'swa_start': 'none',
    'select': 'best',
    'alpha': 0.3,
    'compat': 'fixed',
    'head': 'paper',
    'loss': 'mape',
    'dropout': 0.0,
    'driver_dim': 16,
    'time_bin_min': 1,
    'week': 'day',
    'hidden_size': 128,
    'members': 1,
    'kernels': 'fused',
    'patience': None,
    'seed': 0,
    'data_seed': None,
    'ensemble': 1,
    'split': '0.7/0.15/0.15',
    'split_by': 'random',
    'split_days': None,
    'device': 'cpu',
    'precision': '32',
    'dtype': 'float32',
    'nproc': 1,
    'comm': 'torch',
    'slicer': None,
    'threads': None,
    'max_steps': None,
    'compile': False,
    'out': 'runs/latest',
    'resume': False,
    'overwrite': False,
    'init_from': None,
    'refit_stats': False,
    'allow_outside': False,
    'progress': None,
    'accumulation': None,
    'accum_window': 10,
    'accum_start': 1,
    'lr_scaling': 'sqrt',
    'noise_scale': None,
    'time_budget_s': None,
    'checkpoint_every': None,
    'max_bad_steps': 5,
    'timeout_s': 300.0,
    'parallel': 'dp',
    'micro_batches': None,
    'cp_plan': 'components',
}

EVERY_FLAG = shlex.split(
    "--data x.jsonl --format deeptte --on-error skip --modes car,bus --min-spacing-km 0.5 --gap-min 30 "
    "--tz Europe/Lisbon --n-synthetic 100 --epochs 3 --batch-size 8 --lr 0.01 --weight-decay 0.1 --lr-schedule cosine "
    "--ema-decay 0.9 --alpha 0.5 --compat original --head prior --loss log --dropout 0.1 --driver-dim 4 "
    "--time-bin-min 15 --kernels reference --patience 2 --nproc 2 --comm nccl --slicer equal --threads 2 "
    "--device cuda --dtype float64 --seed 3 --data-seed 4 --ensemble 2 --split 0.8/0.1/0.1 --split-by date "
    "--split-days 1-2/3/4 --max-steps 5 --compile --out o --resume --overwrite --no-progress --accumulation 4 "
    "--accum-window 3 --lr-scaling linear --noise-scale plain --time-budget 60 --checkpoint-every 7 "
    "--max-bad-steps 2 --timeout-s 30 --parallel cp --micro-batches 2 --cp-plan layers "
    "--preset real --select best --week day --hidden-size 32 --members 1 --subtrips 2 --subtrips-resample epoch "
    "--init-from p.pt --refit-stats --allow-outside")  # --swa-start: not with --ema-decay (filled: none)
EVERY_FLAG_CONFIG = {  # what main's cmd_train made of EVERY_FLAG (TrainConfig.to_dict)
    "data": "x.jsonl", "format": "deeptte", "n_synthetic": 100, "on_error": "skip", "columns": None, "modes": ["car", "bus"],
    "min_spacing_km": 0.5, "gap_s": 1800.0, "tz": "Europe/Lisbon", "epochs": 3, "batch_size": 8, "lr": 0.01,
    "weight_decay": 0.1, "lr_schedule": "cosine", "ema_decay": 0.9, "alpha": 0.5, "compat": "original",
    "head": "prior", "loss": "log", "dropout": 0.1, "driver_dim": 4, "time_bin_min": 15, "kernels": "reference",
    "patience": 2, "seed": 3, "data_seed": 4, "ensemble": 2, "split": "0.8/0.1/0.1", "split_by": "date",
    "split_days": "1-2/3/4", "device": "cuda", "precision": "64", "dtype": "float64", "nproc": 2, "comm": "nccl", "slicer": "equal",
    "threads": 2, "max_steps": 5, "compile": True, "out": "o", "resume": True, "overwrite": True, "progress": False,
    "accumulation": "4", "accum_window": 3, "accum_start": 1, "lr_scaling": "linear", "noise_scale": "plain", "time_budget_s": 60.0,
    "checkpoint_every": 7, "max_bad_steps": 2, "timeout_s": 30.0, "parallel": "cp", "micro_batches": 2,
    "cp_plan": "layers", "preset": "real", "select": "best", "week": "day", "swa_start": "none",
    "hidden_size": 32, "members": 1, "subtrips": 2, "subtrips_resample": "epoch",
    "init_from": "p.pt", "refit_stats": True, "allow_outside": True}


def _subparsers(p: argparse.ArgumentParser, prefix: tuple = ()):
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sp in a.choices.items():
                yield from _subparsers(sp, (*prefix, name))
            return
    yield " ".join(prefix), p


def _table(p: argparse.ArgumentParser) -> dict:
    return {a.dest: (tuple(a.option_strings) or None, a.default, tuple(a.choices) if a.choices else None,
                     getattr(a.type, "__name__", None), type(a).__name__.lstrip("_"), a.required, a.nargs)
            for a in p._actions if not isinstance(a, argparse._HelpAction)}


def test_every_command_has_the_pinned_flags_defaults_choices_and_destinations():
    got = {name: _table(p) for name, p in _subparsers(build_parser())}
    assert sorted(got) == sorted(PARSERS)
    for name in PARSERS:
        assert got[name] == PARSERS[name], name


def test_train_config_fields_and_defaults_are_pinned():
    cfg = TrainConfig()
    assert [f.name for f in dataclasses.fields(TrainConfig)] == list(TRAIN_CONFIG)
    assert {k: getattr(cfg, k) for k in TRAIN_CONFIG} == TRAIN_CONFIG


class _Built(Exception):
    pass


@pytest.mark.parametrize("argv, expected", [([], {**TRAIN_CONFIG, "modes": []}), (EVERY_FLAG, EVERY_FLAG_CONFIG)],
                         ids=["defaults", "every-flag"])
def test_train_flags_reach_the_same_config_fields(argv, expected, monkeypatch):
    """``stfast train``'s arguments become the TrainConfig main built (checked where cmd_train validates it)."""
    def built(self):
        raise _Built(self)

    monkeypatch.setattr(TrainConfig, "validate", built)
    with pytest.raises(_Built) as e:
        cli.cmd_train(build_parser().parse_args(["train", *argv]))
    assert e.value.args[0].to_dict() == expected
    assert TrainConfig.from_dict(expected) == e.value.args[0]  # the stored form reads back


# ---------------------------------------------------------------- each option declared once
def test_every_train_config_field_is_declared_once_with_its_help():
    """Each TrainConfig field declares its flag, default and help (stfast._options); the CLI adds no train
    flag of its own, and the model options are DeepTTEConfig's declarations, not copies."""
    from pathlib import Path

    from stfast import _options
    from stfast.models.deeptte import DeepTTEConfig
    from stfast.train.config import MODEL_OPTIONS, flag

    decl = _options.options(TrainConfig)
    assert list(decl) == list(TRAIN_CONFIG) and all(o.help for o in decl.values())
    cli_src = (Path(cli.__file__)).read_text()
    for name in set(decl) - {"split", "out"}:  # evaluate's --split (which split) and --out (where) are others
        assert f'add_argument("{flag(name)}"' not in cli_src, name
    model = {f.name: f for f in dataclasses.fields(DeepTTEConfig)}
    assert set(MODEL_OPTIONS) == {"alpha", "compat", "head", "loss", "dropout", "driver_dim", "time_bin_min", "week",
                                  "hidden_size", "members", "kernels"}
    for name in MODEL_OPTIONS:
        assert decl[name] is _options.declaration(model[name]) and TRAIN_CONFIG[name] == model[name].default


@pytest.mark.parametrize("kw, message", [
    ({"gap_s": -60.0}, "--gap-min must be > 0 minutes, got -1"),  # in the flag's unit
    ({"time_budget_s": 0.0}, "--time-budget must be > 0 s, got 0"),
    ({"alpha": 1.5}, "--alpha must be in [0, 1], got 1.5"),
    ({"dropout": 1.0}, "--dropout must be in [0, 1), got 1"),
    ({"time_bin_min": 0}, "--time-bin-min must be in 1..1440 minutes, got 0"),
    ({"head": "nope"}, "--head must be paper or prior, got 'nope'"),
    ({"parallel": "pp"}, "--parallel must be one of dp, cp, dp+cp, got 'pp'"),
    ({"batch_size": None}, "--batch-size must be given"),  # --epochs None: not given, the preset's
    ({"swa_start": 1.0}, "--swa-start must be in [0, 1), got 1"),
    ({"slicer": None, "threads": 0}, "--threads must be ≥ 1, got 0"),  # None where the field allows it
])
def test_single_field_rules_come_from_the_declaration_and_name_the_flag(kw, message):
    with pytest.raises(ValueError) as e:
        TrainConfig(**kw).validate()
    assert str(e.value) == message


def test_model_config_checks_its_options_by_field_name():
    from stfast.models.deeptte import DeepTTEConfig

    with pytest.raises(ValueError, match=r"^time_bin_min must be in 1\.\.1440 minutes, got 0$"):
        DeepTTEConfig(n_drivers=3, time_bin_min=0)
    with pytest.raises(ValueError, match=r"^kernels must be fused or reference, got 'x'$"):
        DeepTTEConfig(n_drivers=3, kernels="x")


def test_data_flags_shown_in_their_units():
    from stfast.train.config import DATA_OPTIONS, flag, show

    assert [flag(k) for k in DATA_OPTIONS] == ["--modes", "--min-spacing-km", "--gap-min", "--tz"]
    assert [show(k, v) for k, v in zip(DATA_OPTIONS, ([], 0.0, 1200.0, None))] == \
        ["(all)", "0", "20", "(the format's default)"]
    assert show("modes", ["bus", "car"]) == "bus,car"


@pytest.mark.parametrize("field, value, text", [
    ("epochs", "2", "--epochs must be an integer, got '2' (str)"),
    ("epochs", 2.5, "--epochs must be an integer, got 2.5 (float)"),
    ("epochs", True, "--epochs must be an integer, got True (bool)"),
    ("lr", "0.01", "--lr must be a number, got '0.01' (str)"),
    ("nproc", "2", "--nproc must be an integer"),
])
def test_a_field_of_the_wrong_type_is_named(field, value, text):
    """Set in Python, a str reached the range check as a bare TypeError, and 2.5 or True ran as an epoch count."""
    with pytest.raises(ValueError, match=re.escape(text)):
        TrainConfig(n_synthetic=600, out="x", **{field: value}).validate()
    TrainConfig(n_synthetic=600, out="x", lr=1, epochs=3).validate()  # an int where a float is expected is a number


def test_train_config_docstring_names_every_flag_not_of_its_fields_name():
    """Issue 62: TrainConfig's docstring said every field is the flag of its name; the fields whose flag differs
    are named there with their flags."""
    from stfast._options import options
    from stfast.train.config import TrainConfig

    doc = TrainConfig.__doc__
    for name, opt in options(TrainConfig).items():
        flag = getattr(opt, "flag", None)
        if flag and flag != "--" + name.replace("_", "-"):
            assert f"``{name}``" in doc and f"``{flag}``" in doc, (name, flag)
