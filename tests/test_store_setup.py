"""`stfast data convert` derives what the first default `stfast train` on the store would (split, drivers,
normalization, sub-trips, route profile: stfast.data.setup), so that run computes nothing; a store too small for the
default split still converts, and a run derives what its own settings need (issue 53, item 4)."""
from __future__ import annotations

import logging

import pytest

from conftest import random_trips
from stfast.cli import main
from stfast.data import routes, subtrips, training_stats
from stfast.data.setup import DEFAULT, derive
from stfast.data.store import open_store
from stfast.train.config import TrainConfig
from stfast.train.run_data import run_setup

TRAIN = ["--max-steps", "2", "--epochs", "1", "--batch-size", "32", "--threads", "1", "--no-progress"]


def _listing(store) -> dict:
    """name → mtime (ns) of what the store's derived folder holds, its folders' files included."""
    return {str(p.relative_to(store)): p.stat().st_mtime_ns for p in sorted((store / "derived").rglob("*"))}


def _convert(tmp_path, n: int, capsys):
    data = tmp_path / f"trips{n}.jsonl"
    random_trips(n, seed=31, max_len=20).to_jsonl(data)
    store = tmp_path / f"store{n}"
    assert main(["data", "convert", "--data", str(data), "--out", str(store)]) == 0
    return store, capsys.readouterr().out


def test_the_default_train_config_on_a_store_is_the_default_setup(tmp_path, capsys):
    store, _ = _convert(tmp_path, 40, capsys)
    assert run_setup(TrainConfig(data=str(store))) == DEFAULT
    assert run_setup(TrainConfig(data=str(store), subtrips=0)) != DEFAULT  # a setting that matters: another setup


def _no_computing(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("computed at train time")

    monkeypatch.setattr(training_stats.NormStats, "from_trips", boom)
    monkeypatch.setattr(routes.RouteProfile, "from_trips", boom)
    monkeypatch.setattr(subtrips, "subtrip_spans", boom)
    monkeypatch.setattr("stfast.data.setup.split_random", boom)


def test_convert_derives_what_the_first_default_run_needs(tmp_path, capsys, monkeypatch):
    store, out = _convert(tmp_path, 90, capsys)
    assert "derived the default run's split, statistics, sub-trips and route profile in" in out
    before = _listing(store)
    kinds = sorted({name.split("/")[1].split("-")[0] for name in before})
    assert kinds == ["drivers", "norm_stats", "route_profile", "split", "subtrips"]
    _no_computing(monkeypatch)
    run = tmp_path / "run"
    assert main(["train", "--data", str(store), *TRAIN, "--out", str(run)]) == 0, capsys.readouterr().err
    assert (run / "checkpoint.pt").is_file()
    assert _listing(store) == before  # nothing computed, nothing written again


def test_derive_again_computes_nothing_and_times_each_value(tmp_path, capsys, monkeypatch):
    store, _ = _convert(tmp_path, 90, capsys)
    _no_computing(monkeypatch)
    secs = derive(open_store(store), DEFAULT)
    assert sorted(secs) == ["drivers", "norm_stats", "route_profile", "split", "subtrips"]
    assert all(s >= 0 for s in secs.values())


def test_values_a_run_derives_again_are_the_bytes_convert_kept(tmp_path, capsys):
    """A default run on a store whose derived values are gone (removed by hand, or damaged and removed by `stfast
    data verify`) derives each again, bit for bit what convert kept: the same functions over the same pieces of the
    same split, so nothing a run computes from them changes (issue 61: a test MAPE that moved in its 9th digit
    after a rebuilt route profile came from the run's GEMM library, chosen by timing: stfast.train.gemm_plan)."""
    import shutil

    import torch

    from stfast.train.run_data import RunData

    store, _ = _convert(tmp_path, 90, capsys)

    def files():
        return {str(p.relative_to(store)): p.read_bytes() for p in sorted((store / "derived").rglob("*"))
                if p.is_file()}

    kept = files()
    assert len(kept) == 4 + 5 + 3  # split (3 arrays, arrays.json), sub-trips (4, arrays.json), 3 JSON values
    shutil.rmtree(store / "derived")
    data = RunData.load(TrainConfig(data=str(store), out=str(tmp_path / "run")), torch.float32)
    assert data.route_profile  # derived at the first checkpoint's save
    assert files() == kept


def test_a_store_too_small_to_split_converts_and_its_run_derives_later(tmp_path, capsys, caplog):
    with caplog.at_level(logging.INFO, logger="stfast.data"):
        store, out = _convert(tmp_path, 5, capsys)  # 5 trips: the default 0.7/0.15/0.15 leaves a split empty
    assert "derived the default" not in out
    assert any("not derived for the default run" in r.getMessage() and "split is empty" in r.getMessage()
               for r in caplog.records)
    assert not any(p.name.startswith(("norm_stats-", "route_profile-")) for p in (store / "derived").iterdir())
    run = tmp_path / "run"
    assert main(["train", "--data", str(store), "--split", "0.6/0.2/0.2", *TRAIN, "--out", str(run)]) == 0
    kinds = {p.name.split("-")[0] for p in (store / "derived").iterdir()}
    assert {"drivers", "norm_stats", "route_profile", "subtrips"} <= kinds  # derived by the run, kept


def test_a_jsonl_output_is_not_a_store_and_derives_nothing(tmp_path, capsys):
    data = tmp_path / "trips.jsonl"
    random_trips(90, seed=31, max_len=20).to_jsonl(data)
    assert main(["data", "convert", "--data", str(data), "--out", str(tmp_path / "out.jsonl")]) == 0
    assert "derived" not in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl", "trips.jsonl"]


@pytest.mark.parametrize("over", [{"split": "0.5/0.25/0.25"}, {"seed": 3}, {"subtrips": 2},
                                  {"subtrips_resample": "epoch", "epochs": 3}])
def test_other_settings_map_to_other_setups(tmp_path, over):
    assert run_setup(TrainConfig(data=str(tmp_path / "store"), **over)) != DEFAULT


def test_temporaries_of_a_killed_convert_in_derived_are_removed(tmp_path, capsys):
    """A convert killed while keeping a derived value left ``derived/.NAME.tmpPID`` (a folder of arrays, or a JSON
    file) that no later run or convert removed. Now the next write of a value, or ``stfast data verify``, removes
    those of dead processes; a live process's is left alone."""
    import subprocess
    import sys

    from stfast.data.durable import aside

    store, _ = _convert(tmp_path, 90, capsys)
    derived = store / "derived"
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # its pid: a process that is gone
    split = next(derived.glob("split-*"))
    dead_dir, dead_file = aside(split, "tmp", proc.pid), aside(next(derived.glob("norm_stats-*")), "tmp", proc.pid)
    dead_dir.mkdir()
    (dead_dir / "train.npy").write_bytes(b"\x93NUMPY partial")
    dead_file.write_text('{"partial')
    live = aside(split, "tmp", 1)  # pid 1: alive
    live.mkdir()
    next(derived.glob("drivers-*")).unlink()  # so the next run keeps a value again
    derive(open_store(store))
    assert not dead_dir.exists() and not dead_file.exists() and live.is_dir()
    dead_file.write_text('{"partial')
    assert main(["data", "verify", str(store)]) == 0
    assert not dead_file.exists() and live.is_dir()


def test_a_convert_replaced_meanwhile_gets_none_of_the_old_stores_values(tmp_path, capsys):
    """Two converts into one --out at once: the first's derive step ran after the second had replaced the store,
    and kept the first trips' values (never read: another fingerprint, but up to a store's worth of files) in the
    second store's derived folder. Now a value is kept only in the store its trips were read from."""
    store, _ = _convert(tmp_path, 90, capsys)
    old = open_store(store)
    data = tmp_path / "other.jsonl"
    random_trips(70, seed=5, max_len=20).to_jsonl(data)
    assert main(["data", "convert", "--data", str(data), "--out", str(store)]) == 0
    before = _listing(store)
    derive(old)  # the first convert's derive step, on the trips it wrote
    assert _listing(store) == before


def test_convert_says_what_it_could_not_keep_after_the_store_line(tmp_path):
    """convert onto a disk that fits the store, not its derived values: the store's line first, then the warnings of
    the values not kept, then the derive line naming them. Before, the store's line came last, after the warnings,
    and ended "derived the default run's split, statistics, sub-trips and route profile in N s" as if all were kept.
    A fresh process, its stderr and stdout in one stream, a full disk simulated in stfast.data.derived."""
    import subprocess
    import sys

    data = tmp_path / "trips.jsonl"
    random_trips(90, seed=31, max_len=20).to_jsonl(data)
    store = tmp_path / "store"
    code = f"""
import errno, os, sys
from stfast.data import derived
def full(*a, **k):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
derived.seal = full  # writing every derived value fails, within derived's own error handling
from stfast.cli import main
sys.exit(main(["data", "convert", "--data", {str(data)!r}, "--out", {str(store)!r}]))
"""
    p = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout
    lines = p.stdout.strip().splitlines()
    wrote = next(i for i, ln in enumerate(lines) if ln.startswith("wrote 90 trips"))
    warned = [i for i, ln in enumerate(lines) if "not kept, computed again by each run" in ln]
    assert len(warned) == 5 and wrote < min(warned), lines
    assert lines[-1].startswith("derived the default run's split, statistics, sub-trips and route profile in "), lines
    assert lines[-1].endswith(", but could not keep split, drivers, norm_stats, subtrips, route_profile (see the "
                              f"warnings above): each `stfast train` on {store} computes them again"), lines
    assert (store / "manifest.json").is_file()


def test_a_value_not_kept_on_a_full_disk_is_said_and_leaves_no_temporary(tmp_path, capsys, caplog, monkeypatch):
    """convert onto a nearly full disk (a tmpfs that fits the store, not its derived values) said "derived the
    default run's ..." and left ``derived/.route_profile-KEY.json.tmpPID``; the values were silently (debug level)
    not kept, so every run computed them again. Now the temporary is removed and a full disk is a warning."""
    import errno
    import os

    from stfast.data import derived

    store, _ = _convert(tmp_path, 90, capsys)
    next((store / "derived").glob("drivers-*")).unlink()

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(derived.os, "fsync", full)
    with caplog.at_level(logging.WARNING, logger="stfast"):
        derive(open_store(store))
    assert not [p.name for p in (store / "derived").iterdir() if p.name.startswith(".")]
    assert "derived value drivers not kept, computed again by each run" in caplog.text
    assert "No space left on device; the disk is full" in caplog.text
