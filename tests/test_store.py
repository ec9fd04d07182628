"""The trips store (stfast.data.store), streaming conversion (stfast.data.convert) and the block readers:
a store equals the in-memory read of the same raw data, opens memory-mapped with the fingerprint recorded,
refuses other preprocessing settings, and a failed conversion leaves nothing; `stfast data convert --out DIR`,
`train --data DIR`, `predict --split test` and `load_model(...).load_trips(DIR)` work from it."""
from __future__ import annotations

import csv
import json
import os

import numpy as np
import pytest

from _accuracy import fresh_seed
from conftest import random_trips
from stfast.cli import main
from stfast.data import convert as conv
from stfast.data.errors import TrajectoryFormatError
from stfast.data.fingerprint import compute_fingerprint, trips_fingerprint
from stfast.data.load import load_trips
from stfast.data.readers import _common, read_deeptte_jsonl
from stfast.data.readers import deeptte_json as dj
from stfast.data.store import MANIFEST, STORE_FORMAT, open_store

FIELDS = ("offsets", "lng", "lat", "state", "time_gap", "dist_gap", "dist", "time", "week_id", "time_id",
          "date_id", "segment")


def _didi(path, n_orders=120, n_pts=30, seed=0, shuffle=False):
    rng = np.random.default_rng(seed)
    rows = []
    for o in range(n_orders):
        t0 = 1477955400 + int(rng.integers(0, 80000))
        x, y = 104.0 + rng.uniform(0, 0.1), 30.6 + rng.uniform(0, 0.1)
        for k in range(n_pts):
            x, y = x + rng.uniform(0.0005, 0.003), y + rng.uniform(-0.001, 0.002)
            rows.append(f"{'%032x' % (o % 17)},{'%032x' % (1000 + o)},{t0 + 3 * k + int(rng.integers(0, 3))},"
                        f"{x:.5f},{y:.5f}")
    if shuffle:
        rng.shuffle(rows)
    path.write_text("\n".join(rows) + "\n")
    return path


def _same(a, b):
    for f in FIELDS:
        assert np.array_equal(np.asarray(getattr(a, f)), np.asarray(getattr(b, f))), f
    assert list(map(str, a.driver)) == list(map(str, b.driver))
    assert list(map(str, a.trip_id)) == list(map(str, b.trip_id))
    assert a.dropped == b.dropped


@pytest.fixture
def small_parts(monkeypatch):
    """Blocks of ~4 KB and spill partitions of 7 trips: many blocks, partitions and preprocessing chunks."""
    monkeypatch.setattr(_common, "BLOCK_BYTES", 4096)
    monkeypatch.setattr(conv, "TRIPS_PER_BUCKET", 7)
    monkeypatch.setattr(conv, "MAX_POINTS_PER_PART", 300)


@pytest.mark.parametrize("shuffle", [False, True])
def test_didi_store_equals_in_memory_read(tmp_path, small_parts, shuffle):
    raw = _didi(tmp_path / "gps_20161101", shuffle=shuffle)
    whole = load_trips(str(raw))
    store = conv.convert_to_store(str(raw), tmp_path / "store")
    _same(whole, store)
    assert store.fingerprint == compute_fingerprint(whole) == trips_fingerprint(store)
    assert isinstance(store.lng, np.memmap) and not store.lng.flags.writeable
    m = json.loads((tmp_path / "store" / MANIFEST).read_text())
    assert m["format"] == STORE_FORMAT and m["n_trips"] == len(whole) and m["tz"] == "Asia/Shanghai"
    assert m["preprocess_config"]["gap_s"] == 1200.0 and m["fingerprint"] == store.fingerprint
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp or spill folder left


def test_csv_store_equals_in_memory_read(tmp_path, small_parts):
    rng = np.random.default_rng(3)
    lines = ["trip_id,timestamp,lng,lat,driver_id"]
    for tr in range(60):
        for k in range(25):
            s = 1478000000 + 86000 * (tr % 3) + 11 * k
            ts = {0: str(s), 1: f"2016-11-01T{(s // 3600) % 24:02d}:{(s // 60) % 60:02d}:{s % 60:02d}+08:00",
                  2: f"2016-11-02 {(s // 3600) % 24:02d}:{(s // 60) % 60:02d}:{s % 60:02d}.25Z"}[tr % 3]
            lines.append(f"t{tr},{ts},{-9.1 + 0.002 * k + rng.uniform(0, 1e-4):.6f},{38.7 + 0.001 * k:.6f},d{tr % 5}")
    order = rng.permutation(len(lines) - 1) + 1
    raw = tmp_path / "points.csv"
    raw.write_text("\n".join([lines[0]] + [lines[i] for i in order]) + "\n")
    whole = load_trips(str(raw))
    assert len(whole) > 30
    _same(whole, conv.convert_to_store(str(raw), tmp_path / "s"))


def test_fast_csv_path_parses_as_the_csv_module(tmp_path, monkeypatch):
    """Blocks the vectorized parse takes give what the csv module + parse_timestamp_offset give."""
    from stfast.data.readers import csv_points, read_csv_points

    raw = tmp_path / "p.csv"
    raw.write_text("trip_id,timestamp,lng,lat,state\n" + "".join(
        f"a,2016-03-27T0{k}:30:00.5+01:00,1.0{k},2.0,1\nb,2016-03-27 0{k}:00:00,1.{k},2.0,0\n" for k in range(9)))
    fast = read_csv_points(raw)
    monkeypatch.setattr(csv_points, "_parse_block", lambda *a: None)
    slow = read_csv_points(raw)
    for f in ("offsets", "lng", "lat", "t", "state", "utc_offset_s"):
        assert np.array_equal(getattr(fast, f), getattr(slow, f), equal_nan=True), f
    assert fast.tz == slow.tz and list(fast.trip_id) == ["a", "b"]


def test_deeptte_blocks_equal_line_by_line(tmp_path, monkeypatch):
    data = tmp_path / "t.jsonl"
    trips = random_trips(200, seed=5)
    trips.to_jsonl(data)
    text = data.read_text().splitlines()
    data.write_text("\n".join(text[:50] + [""] + [json.dumps({k: v for k, v in json.loads(t).items() if k != "tripID"})
                                                   for t in text[50:]]) + "\n")
    monkeypatch.setattr(_common, "BLOCK_BYTES", 8192)
    fast = read_deeptte_jsonl(data)
    monkeypatch.setattr(dj, "_fast_block", lambda *a: None)
    slow = read_deeptte_jsonl(data)
    _same(fast, slow)
    assert fast.trip_id[60] == "62"  # the line number (a blank line 51) where a record has no tripID
    assert fast.tz == slow.tz


def _raw_with_a_bad_line_far_in(tmp_path, fmt: str):
    """(good raw file, the same with one bad line far into it, that line's 1-based number, the field it names):
    with BLOCK_BYTES = 2048 the bad line lies past dozens of blocks, as a line 60 M points into a file lies
    past thousands of the default 32 MiB blocks."""
    if fmt == "didi":
        good, bad, at, field = _didi(tmp_path / "gps_1", n_orders=120), tmp_path / "bad" / "gps_1", 3001, "lat"
        lines = good.read_text().splitlines()
        lines[at - 1] = lines[at - 1].rsplit(",", 1)[0] + ",95.0"
    elif fmt == "csv":
        good, bad, at, field = tmp_path / "points.csv", tmp_path / "bad" / "points.csv", 2402, "timestamp"
        lines = ["trip_id,timestamp,lng,lat"] + [f"t{tr},{1478000000 + 11 * k},{-9.1 + 0.002 * k:.6f},{38.7 + 0.001 * k:.6f}"
                                                 for tr in range(100) for k in range(30)]
        good.write_text("\n".join(lines) + "\n")
        lines[at - 1] = "t80,2016-13-01 10:00:00,-9.1,38.7"  # no month 13
    else:
        good, bad, at, field = tmp_path / "trips.jsonl", tmp_path / "bad" / "trips.jsonl", 250, "time_gap"
        random_trips(300, seed=7, max_len=20).to_jsonl(good)
        lines = good.read_text().splitlines()
        rec = json.loads(lines[at - 1])
        rec["time_gap"] = rec["time_gap"][:-1]  # one value short of lngs
        lines[at - 1] = json.dumps(rec)
    bad.parent.mkdir()
    bad.write_text("\n".join(lines) + "\n")
    assert bad.stat().st_size > 40 * 2048
    return good, bad, at, field


def _listing(folder) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("fmt", ["didi", "csv", "deeptte"])
def test_bad_line_far_into_a_file_is_named_and_loses_nothing(tmp_path, monkeypatch, capsys, fmt):
    """The error names the file, the 1-based line and the field; the failed conversion leaves no folder at --out
    and no temporary or spill folder beside it, and an older store at --out keeps its bytes. `--on-error skip`
    counts the line."""
    monkeypatch.setattr(_common, "BLOCK_BYTES", 2048)
    good, bad, at, field = _raw_with_a_bad_line_far_in(tmp_path, fmt)
    old = conv.convert_to_store(str(good), tmp_path / "s")
    manifest = (tmp_path / "s" / MANIFEST).read_bytes()
    before = _listing(tmp_path)
    for out in ("s", "new"):
        with pytest.raises(TrajectoryFormatError) as ei:
            conv.convert_to_store(str(bad), tmp_path / out)
        assert (ei.value.path, ei.value.line, ei.value.field) == (str(bad), at, field)
        assert main(["data", "convert", "--data", str(bad), "--out", str(tmp_path / out)]) == 2
        assert f"{bad}:{at}: field '{field}'" in capsys.readouterr().err
        assert _listing(tmp_path) == before
        assert (tmp_path / "s" / MANIFEST).read_bytes() == manifest
        assert open_store(tmp_path / "s").fingerprint == old.fingerprint
    skipped = conv.convert_to_store(str(bad), tmp_path / "new", on_error="skip")
    assert skipped.dropped["bad_line"] == 1


@pytest.mark.parametrize("fmt", ["didi", "csv", "deeptte"])
def test_interrupted_conversion_loses_nothing(tmp_path, monkeypatch, small_parts, fmt):
    """A conversion stopped midway (Ctrl-C while it appends its second chunk of trips) leaves no folder at --out,
    no temporary or spill folder beside it, and an older store at --out as it was."""
    from stfast.data.store import StoreWriter

    good, _, _, _ = _raw_with_a_bad_line_far_in(tmp_path, fmt)
    old = conv.convert_to_store(str(good), tmp_path / "s")
    manifest = (tmp_path / "s" / MANIFEST).read_bytes()
    before = _listing(tmp_path)
    append, calls = StoreWriter.append, []

    def interrupted(self, trips):
        calls.append(len(trips))
        if len(calls) == 2:
            raise KeyboardInterrupt
        append(self, trips)

    monkeypatch.setattr(StoreWriter, "append", interrupted)
    for out in ("s", "new"):
        calls.clear()
        with pytest.raises(KeyboardInterrupt):
            conv.convert_to_store(str(good), tmp_path / out)
        assert len(calls) == 2 and _listing(tmp_path) == before
        assert (tmp_path / "s" / MANIFEST).read_bytes() == manifest
        assert open_store(tmp_path / "s").fingerprint == old.fingerprint


def test_failed_conversion_keeps_the_old_store(tmp_path, small_parts):
    raw = _didi(tmp_path / "gps_1", n_orders=20)
    first = conv.convert_to_store(str(raw), tmp_path / "s")
    raw.write_text(raw.read_text() + "x,y,not-a-time,1,2\n")
    with pytest.raises(TrajectoryFormatError, match="unix_ts"):
        conv.convert_to_store(str(raw), tmp_path / "s")
    assert open_store(tmp_path / "s").fingerprint == first.fingerprint
    (tmp_path / "notastore").mkdir()
    (tmp_path / "notastore" / "mine.txt").write_text("the user's")
    with pytest.raises(ValueError, match="not a trips store"):
        conv.convert_to_store(str(raw), tmp_path / "notastore")
    assert [p.name for p in (tmp_path / "notastore").iterdir()] == ["mine.txt"]


def test_store_settings_conflicts_are_refused(tmp_path):
    raw = _didi(tmp_path / "gps_1", n_orders=20)
    conv.convert_to_store(str(raw), tmp_path / "s", gap_s=600.0)
    assert len(load_trips(str(tmp_path / "s"))) > 0  # defaults: not given, the store's settings hold
    with pytest.raises(ValueError, match=r"gap_s=300.0 differs .*gap_s=600.0"):
        load_trips(str(tmp_path / "s"), gap_s=300.0)
    with pytest.raises(ValueError, match=r"tz='UTC' differs .*Asia/Shanghai"):
        load_trips(str(tmp_path / "s"), tz="UTC")
    with pytest.raises(ValueError, match="--format didi does not apply"):
        load_trips(str(tmp_path / "s"), "didi")


@pytest.mark.parametrize("flag, made, given, shown", [
    ("--gap-min", "10", "20", ("20", "10")),  # 20, 0.2, all and the format's zone: the defaults
    ("--min-spacing-km", "0.5", "0.2", ("0.2", "0.5")),
    ("--modes", "walk", "", ("(all)", "walk")),
    ("--tz", "Europe/Lisbon", "Asia/Shanghai", ("Asia/Shanghai", "Europe/Lisbon")),
])
def test_cli_refuses_a_given_flag_at_its_default_against_a_store(tmp_path, capsys, shared_data, flag, made, given,
                                                                  shown):
    """A preprocessing flag given on the command line counts as asked for even at its default value: against a
    store made with another value `data convert` and `train` refuse it, naming the flag and both values."""
    store = tmp_path / "store"
    raw = shared_data / "geolife_sample" / "Data" / "010"
    assert main(["data", "convert", "--data", str(raw), "--out", str(store), flag, made]) == 0
    capsys.readouterr()
    want = f"{flag} {shown[0]} differs from the trips store {store}'s {flag} {shown[1]}"
    for cmd in (["data", "convert", "--out", str(tmp_path / "t.jsonl")],
                ["train", "--epochs", "1", "--out", str(tmp_path / "run"), "--no-progress", "--threads", "1"]):
        assert main([*cmd, "--data", str(store), f"{flag}={given}"]) == 2
        assert want in capsys.readouterr().err
        assert not (tmp_path / "t.jsonl").exists() and not (tmp_path / "run").exists()
    assert main(["data", "convert", "--data", str(store), "--out", str(tmp_path / "t.jsonl"), flag, made]) == 0
    assert main(["data", "convert", "--data", str(store), "--out", str(tmp_path / "u.jsonl")]) == 0  # not given
    assert (tmp_path / "t.jsonl").read_bytes() == (tmp_path / "u.jsonl").read_bytes()


def test_cli_store_train_predict_and_load_model(tmp_path, capsys):
    import stfast

    data = tmp_path / "trips.jsonl"
    random_trips(90, seed=31, max_len=20).to_jsonl(data)
    store = tmp_path / "store"
    assert main(["data", "convert", "--data", str(data), "--out", str(store)]) == 0
    assert "trips store" in capsys.readouterr().out
    run = tmp_path / "run"
    assert main(["train", "--data", str(store), "--epochs", "1", "--batch-size", "32", "--out", str(run),
                 "--no-progress", "--threads", "1"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    preds = tmp_path / "p.csv"
    assert main(["predict", "--checkpoint", str(run / "checkpoint.pt"), "--split", "test", "--out", str(preds)]) == 0
    rows = list(csv.DictReader(open(preds)))
    true = np.array([float(r["true_time_s"]) for r in rows])
    pred = np.array([float(r["pred_time_s"]) for r in rows])
    assert len(rows) == summary["n_test"] and np.mean(np.abs(pred - true) / true) == pytest.approx(
        summary["test_mape"], abs=1e-4)  # the CSV rounds the times
    m = stfast.load_model(run / "checkpoint.pt")
    assert m.data_fingerprint == open_store(store).fingerprint == compute_fingerprint(read_deeptte_jsonl(data))
    assert len(m.load_trips(str(store))) == 90
    assert main(["evaluate", "--checkpoint", str(run / "checkpoint.pt"), "--data", str(store), "--gap-min", "5"]) == 2
    assert "differs" in capsys.readouterr().err
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())
    assert os.path.isdir(store)


@pytest.mark.slow
def test_two_ranks_train_from_a_store_and_resume(tmp_path):
    """--nproc 2 reads the store (memory-mapped in both ranks); --resume checks the manifest's fingerprint."""
    import subprocess
    import sys

    from stfast.train import checkpoint as ckpt

    data = tmp_path / "trips.jsonl"
    random_trips(120, seed=4, max_len=20).to_jsonl(data)
    store = tmp_path / "store"
    assert main(["data", "convert", "--data", str(data), "--out", str(store)]) == 0
    args = [sys.executable, "-m", "stfast.cli", "train", "--data", str(store), "--epochs", "1", "--batch-size", "16",
            "--nproc", "2", "--threads", "1", "--no-progress", "--out", str(tmp_path / "run")]
    r = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert ckpt.load(tmp_path / "run" / "last.pt")["data_fingerprint"] == open_store(store).fingerprint
    args[args.index("--epochs") + 1] = "2"
    r = subprocess.run([*args, "--resume"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["epochs"] == 2


def test_deeptte_store_streams_blocks_and_drops_short_records(tmp_path, monkeypatch):
    monkeypatch.setattr(_common, "BLOCK_BYTES", 4096)
    data = tmp_path / "t.jsonl"
    trips = random_trips(80, seed=9, min_len=2, max_len=12)
    trips.to_jsonl(data)
    whole = load_trips(str(data))
    assert whole.dropped.get("too_short", 0) > 0
    store = conv.convert_to_store(str(data), tmp_path / "s")
    _same(whole, store)
    assert store.fingerprint == compute_fingerprint(whole) and store.tz == whole.tz
    assert sorted(store.dropped_trips) == sorted(whole.dropped_trips)


def test_quoted_line_break_across_a_block_boundary(tmp_path, monkeypatch):
    """A quoted field holding a line break (an extra column) read in blocks cut inside the quotes gives what one
    block gives: the block reader joins a block that ends inside a quoted field with the next."""
    rows = ["trip_id,timestamp,lng,lat,note"]
    for tr in range(40):
        for k in range(12):
            rows.append(f't{tr},{1478000000 + 97 * tr + 13 * k},{104.0 + 0.003 * k:.5f},{30.6 + 0.001 * tr:.5f},'
                        f'"stop {k},\nthen ""on"" {tr}"')
    raw = tmp_path / "notes.csv"
    raw.write_text("\n".join(rows) + "\n")
    whole = load_trips(str(raw))
    assert len(whole) == 40
    for size in (97, 1000, 4096):  # cuts inside the quotes at many offsets
        monkeypatch.setattr(_common, "BLOCK_BYTES", size)
        _same(whole, load_trips(str(raw)))
        _same(whole, conv.convert_to_store(str(raw), tmp_path / f"s{size}"))


def test_read_ahead_keeps_order_and_raises_where_the_error_is():
    """_read_ahead yields (item, parse(item)) in input order; an error of parse or of the input surfaces when
    its item's turn comes, after every item before it."""
    seen = []
    for item, got in _common._read_ahead(iter(range(50)), lambda i: i * i, depth=3):
        seen.append((item, got))
    assert seen == [(i, i * i) for i in range(50)]

    def parse(i):
        if i == 7:
            raise ValueError("item 7")
        return -i

    got = []
    with pytest.raises(ValueError, match="item 7"):
        for item, r in _common._read_ahead(iter(range(20)), parse):
            got.append(item)
    assert got == list(range(7))

    def items():
        yield from range(4)
        raise TrajectoryFormatError("f.csv", 9, "lng", "bad")

    got = []
    with pytest.raises(TrajectoryFormatError, match="f.csv"):
        for item, r in _common._read_ahead(items(), lambda i: i):
            got.append(item)
    assert got == [0, 1, 2, 3]


@pytest.mark.parametrize("workers", [2, 3])
def test_read_ahead_parses_side_by_side_and_keeps_order(workers):
    """With ``workers`` > 1, _read_ahead parses that many items at the same time (a barrier only they pass
    together) and still yields them in input order, whichever parse ends first; errors surface in order."""
    import random
    import threading
    import time as _time

    together = threading.Barrier(workers, timeout=10)

    def parse(i):
        if i < workers:
            together.wait()  # raises BrokenBarrierError unless `workers` parses run at once
        _time.sleep(random.Random(i).uniform(0, 0.004))
        if i == 31:
            raise ValueError("item 31")
        return i * i

    got = []
    with pytest.raises(ValueError, match="item 31"):
        for item, r in _common._read_ahead(iter(range(40)), parse, depth=2, workers=workers):
            got.append((item, r))
    assert got == [(i, i * i) for i in range(31)]


@pytest.mark.parametrize("grouped", [True, False])
def test_spill_writes_each_partition_its_rows_in_order(tmp_path, monkeypatch, grouped):
    """_Spill.add: each row lands in its trip's partition file, a partition's rows in block order (a stable
    sort by partition), whether the block's rows come grouped by partition (sorted input: no sort) or not."""
    monkeypatch.setattr(conv, "TRIPS_PER_BUCKET", 5)
    rng_seed = fresh_seed()
    rng = np.random.default_rng(rng_seed)
    code = np.sort(rng.integers(0, 40, 500)) if grouped else rng.integers(0, 40, 500)
    block = {"code": code, "t": rng.random(500), "lng": rng.random(500), "lat": rng.random(500)}
    spill = conv._Spill(tmp_path, extra=())
    spill.add(block)
    order = np.argsort(code // 5, kind="stable")
    for k in range(8):
        got = np.fromfile(tmp_path / f"{k}.bin", spill.dtype) if (tmp_path / f"{k}.bin").exists() else None
        want = order[(code // 5)[order] == k]
        assert spill.points.get(k, 0) == len(want), rng_seed
        if len(want):
            assert np.array_equal(got["code"], code[want]) and np.array_equal(got["t"], block["t"][want]), rng_seed
