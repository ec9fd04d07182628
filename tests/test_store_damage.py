"""Damage to a trips store or to its kept derived values is found before anything uses them (issue 53).

A matrix of file × kind of damage: a damaged store stops with one line naming the file (exit 2, no traceback),
from `stfast data verify`, from `stfast data convert --data STORE` (the path `train` and `predict` take to open a
store) and from open_store; a damaged derived value is computed again with a warning and gives the same results
as before the damage. On the code before checksums every row passed the damage through (or raised a traceback)."""
from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest

from stfast.cli import main
from stfast.data import dataset, derived, routes
from stfast.data.integrity import DamagedError
from stfast.data.load import load_trips
from stfast.data.store import MANIFEST, open_store, write_store
from stfast.data.synthetic import synthetic_trips
from stfast.train.config import TrainConfig
from stfast.train.run_data import split_trips

_HEADER = 128  # the .npy header the store writes (its data starts here)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A store converted once; each test damages a copy."""
    root = tmp_path_factory.mktemp("made")
    write_store(synthetic_trips(200, seed=7), root / "store")
    return root / "store"


@pytest.fixture
def store(made, tmp_path):
    import shutil

    shutil.copytree(made, tmp_path / "store")
    open_store(tmp_path / "store")  # a first open checks the copy (new stamps) and records them
    return tmp_path / "store"


def _flip_bits(p, n=11, seed=0, low=False):
    """Flip ``n`` bits of the data of file ``p`` (an exponent bit of a float64, or its lowest mantissa bit)."""
    rng = np.random.default_rng(seed)
    raw = bytearray(p.read_bytes())
    start = _HEADER if p.suffix == ".npy" else 0
    for at in rng.choice(np.arange(start, len(raw) - 8, 8), n, replace=False):
        if low or p.suffix != ".npy":
            raw[at] ^= 1
        else:
            raw[at + 6] ^= 0x20  # float64 little-endian: an exponent bit
    p.write_bytes(bytes(raw))


def _damage(store, name, kind):
    p = store / name
    if kind == "bit flips":
        _flip_bits(p)
    elif kind == "low bit flip":
        _flip_bits(p, n=1, low=True)
    elif kind == "truncated to 0":
        p.write_bytes(b"")
    elif kind == "truncated":
        p.write_bytes(p.read_bytes()[:-16])
    elif kind == "header dtype":
        p.write_bytes(p.read_bytes().replace(b"'<f8'", b"'<f4'", 1).replace(b"'<i8'", b"'<i4'", 1))
    elif kind == "swapped with lat":
        a, b = p.read_bytes(), (store / "lat.npy").read_bytes()
        p.write_bytes(b)
        (store / "lat.npy").write_bytes(a)
    elif kind == "edited":
        m = json.loads(p.read_text())
        m["n_trips"] -= 1
        p.write_text(json.dumps(m))
    elif kind == "missing":
        p.unlink()
    else:
        raise AssertionError(kind)


CASES = [(f, k) for f in ("lng.npy", "lat.npy", "time.npy", "time_gap.npy", "offsets.npy", "week_id.npy")
         for k in ("bit flips", "low bit flip", "truncated to 0", "truncated", "header dtype")]
CASES += [("lng.npy", "swapped with lat"), ("driver.npy", "low bit flip"), ("trip_id.npy", "truncated to 0"),
          ("dropped_reason.npy", "truncated to 0"), ("state.npy", "low bit flip"), (MANIFEST, "edited"),
          (MANIFEST, "truncated to 0"), ("dist.npy", "missing")]


@pytest.mark.parametrize("name, kind", CASES, ids=[f"{f}-{k}" for f, k in CASES])
def test_damaged_store_stops_naming_the_file(store, tmp_path, capsys, name, kind):
    _damage(store, name, kind)
    for argv in (["data", "verify", str(store)],
                 ["data", "convert", "--data", str(store), "--out", str(tmp_path / "t.jsonl")]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert err.startswith(f"stfast: error: {store / name}: damaged"), err
        assert not (tmp_path / "t.jsonl").exists()
    with pytest.raises(DamagedError) as e:
        load_trips(str(store))
    assert e.value.path == str(store / name)


def test_store_checks_cost_nothing_when_unchanged_and_every_file_on_verify(store, monkeypatch, capsys):
    """Opening an unchanged store hashes no file; a damaged file whose stamp was put back (bits rotted on disk)
    is not seen by an open, and `stfast data verify` finds it."""
    import stfast.data.store_checks as sc

    hashed = []
    real = sc.file_checksum
    monkeypatch.setattr(sc, "file_checksum", lambda p: hashed.append(p.name) or real(p))
    open_store(store)
    assert hashed == []
    p = store / "time.npy"
    st = os.stat(p)
    _flip_bits(p, n=1, low=True)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    (store / "checked.json").write_text(json.dumps(
        {**json.loads((store / "checked.json").read_text()), "time.npy": sc.stamp(p)}))
    open_store(store)
    assert hashed == []
    assert main(["data", "verify", str(store)]) == 2
    assert f"{p}: damaged" in capsys.readouterr().err


def test_touched_store_is_hashed_once(store, monkeypatch):
    import stfast.data.store_checks as sc

    hashed = []
    real = sc.file_checksum
    monkeypatch.setattr(sc, "file_checksum", lambda p: hashed.append(p.name) or real(p))
    os.utime(store / "lat.npy")
    open_store(store)
    open_store(store)
    assert hashed == ["lat.npy"]


def _refuse_writes_into(store, monkeypatch):
    """The store's folder refuses writes, as a read-only mount does (root ignores a folder's mode)."""
    import stfast.data.store as st

    real_atomic_file = st.atomic_file

    def atomic_file(path, *a, **kw):
        if path.parent == store:
            raise PermissionError(13, "Read-only file system", str(path))
        return real_atomic_file(path, *a, **kw)

    monkeypatch.setattr(st, "atomic_file", atomic_file)


def test_store_that_cannot_be_written_is_hashed_once(store, monkeypatch, tmp_path, caplog):
    """A store whose folder cannot be written (a read-only mount) keeps its check in the user's cache: the
    second open hashes nothing (before: every open hashed every changed file again, ~2 s at 10 M trips, and
    said "changed since last checked" of a store nobody changed)."""
    import stfast.data.store as st
    import stfast.data.store_checks as sc

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    _refuse_writes_into(store, monkeypatch)
    (store / st.CHECKED).unlink()
    hashed = []
    real = sc.file_checksum
    monkeypatch.setattr(sc, "file_checksum", lambda p: hashed.append(p.name) or real(p))
    with caplog.at_level(logging.INFO, logger="stfast.data"):
        open_store(store)
    n = len(hashed)
    assert n == len(st.read_manifest(store)["files"]) and "no earlier check recorded" in caplog.text
    assert not (store / st.CHECKED).exists() and len(list((tmp_path / "cache" / "stfast" / "checked").iterdir())) == 1
    open_store(store)
    assert len(hashed) == n
    os.utime(store / "lat.npy")  # a change is still seen
    open_store(store)
    assert hashed[n:] == ["lat.npy"]


def test_a_read_only_store_without_a_writable_cache_is_hashed_once(store, monkeypatch, tmp_path, caplog):
    """A store that cannot be written, and a user's cache that cannot either (a read-only home, as in many
    containers): its check is kept in this user's own folder of the temporary folder, so the next open hashes
    nothing (before: every open hashed every file again)."""
    import stat
    import tempfile

    import stfast.data.store as st
    import stfast.data.store_checks as sc

    _refuse_writes_into(store, monkeypatch)
    (store / st.CHECKED).unlink()
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "a-file"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    hashed = []
    real = sc.file_checksum
    monkeypatch.setattr(sc, "file_checksum", lambda p: hashed.append(p.name) or real(p))
    open_store(store)
    n = len(hashed)
    assert n == len(st.read_manifest(store)["files"])
    open_store(store)
    assert len(hashed) == n
    mine = tmp_path / "tmp" / f"stfast-{os.getuid()}"
    assert stat.S_IMODE(mine.stat().st_mode) == 0o700 and len(list((mine / "checked").iterdir())) == 1
    os.chmod(mine, 0o777)  # a folder others may write into is not trusted: its records are not read
    open_store(store)
    assert len(hashed) == 2 * n


def test_files_whose_stamps_changed_but_not_their_contents_are_not_said_changed(store, caplog):
    """A file touched, copied or given other permissions has another stamp, so it is checked again; found intact,
    its contents did not change, and the log does not say it did (before: "1 files changed since last
    checked")."""
    open_store(store)
    os.utime(store / "lat.npy")
    with caplog.at_level(logging.INFO, logger="stfast.data"):
        open_store(store)
    assert "changed" not in caplog.text
    assert "1 files checked again, their stamps not those of their last check" in caplog.text
    assert "intact" in caplog.text


def test_a_check_kept_nowhere_is_warned_once_and_a_relative_cache_home_ignored(store, monkeypatch, tmp_path,
                                                                                caplog):
    """Where neither the store nor the cache folder can be written, every open checks the store again: a warning
    says so once, naming the cache path (before: silent). A relative XDG_CACHE_HOME is invalid (XDG spec) and
    ignored: ~/.cache is used (before: a folder made in the working directory)."""
    import stfast.data.store as st

    import tempfile

    _refuse_writes_into(store, monkeypatch)
    monkeypatch.setattr(st, "_warned_unrecorded", set())
    (store / st.CHECKED).unlink()
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "a-file"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "a-file"))  # no temporary folder to keep it in either
    with caplog.at_level(logging.WARNING, logger="stfast.data"):
        open_store(store)
        open_store(store)
    assert caplog.text.count("its check could not be recorded") == 1 and str(tmp_path / "a-file") in caplog.text
    monkeypatch.setenv("XDG_CACHE_HOME", "relative-cache")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert st._checked_records(store, temp=False)[-1].parent == tmp_path / "home" / ".cache" / "stfast" / "checked"
    open_store(store)
    assert not (tmp_path / "relative-cache").exists()
    assert len(list((tmp_path / "home" / ".cache" / "stfast" / "checked").iterdir())) == 1


def _derive(path):
    train, val, test = split_trips(open_store(path), TrainConfig(data=str(path)))
    return ([list(v.index) for v in (train, val, test)], dataset.NormStats.of_split(train, 3).__dict__,
            dataset.DriverVocab.of_split(train).to_list(), routes.RouteProfile.of_split(train))


def _kept(store, name):
    return next(p for p in (store / "derived").iterdir() if p.name.startswith(name + "-"))


def _double_first_number(v) -> bool:
    """Double the first number in the JSON value ``v`` (dicts by sorted key), in place; True when one was found."""
    keys = sorted(v) if isinstance(v, dict) else range(len(v)) if isinstance(v, list) else ()
    for k in keys:
        if isinstance(v[k], (int, float)) and not isinstance(v[k], bool) and v[k] != 0:
            v[k] *= 2
            return True
        if _double_first_number(v[k]):
            return True
    return False


def _edit_json(p, fn):
    rec = json.loads(p.read_text())
    fn(rec["value"])
    p.write_text(json.dumps(rec))


CACHE_CASES = {
    "split index 0-byte": lambda s: (_kept(s, "split") / "train.npy").write_bytes(b""),
    "split index flipped": lambda s: _flip_bits(_kept(s, "split") / "test.npy", n=3, low=True),
    "split train and test swapped": lambda s: [os.replace(_kept(s, "split") / a, _kept(s, "split") / b) for a, b in
                                               (("train.npy", "x.npy"), ("test.npy", "train.npy"),
                                                ("x.npy", "test.npy"))],
    "split arrays.json 0-byte": lambda s: (_kept(s, "split") / "arrays.json").write_bytes(b""),
    "norm_stats key missing": lambda s: _edit_json(_kept(s, "norm_stats"), lambda v: v.pop(sorted(v)[0])),
    "norm_stats edited": lambda s: _edit_json(_kept(s, "norm_stats"), _double_first_number),
    "norm_stats 0-byte": lambda s: _kept(s, "norm_stats").write_bytes(b""),
    "drivers not JSON": lambda s: _kept(s, "drivers").write_text("{"),
}


@pytest.mark.parametrize("case", list(CACHE_CASES))
def test_damaged_derived_value_is_computed_again(store, caplog, case):
    first = _derive(store)
    kept = sorted(p.name for p in (store / "derived").iterdir())
    CACHE_CASES[case](store)
    with caplog.at_level(logging.WARNING, logger="stfast.data"):
        again = _derive(store)
    warned = [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()]
    assert len(warned) == 1 and "derived" in warned[0] and "computed again" in warned[0]
    assert repr(again) == repr(first)
    assert sorted(p.name for p in (store / "derived").iterdir()) == kept  # replaced under the same name
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="stfast.data"):
        assert repr(_derive(store)) == repr(first)
    assert not [r for r in caplog.records if "damaged" in r.getMessage()]  # the replacement is intact


def test_every_checksum_mismatch_is_worded_alike(store, caplog):
    """A kept derived value's array, a sealed derived record (JSON) and a store's column whose checksum differs: one
    wording (integrity.checksum_differs). Before, a derived array said "checksum differs from the one recorded when
    it was kept" and a sealed record "its content differs from what was written (checksum mismatch)"."""
    import re

    said = r"damaged \(its xxh3_64 checksum [0-9a-f]{16} differs from [0-9a-f]{16}, recorded %s\)"
    _derive(store)
    CACHE_CASES["split index flipped"](store)
    CACHE_CASES["norm_stats edited"](store)
    with caplog.at_level(logging.WARNING, logger="stfast.data"):
        _derive(store)
    warned = [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()]
    assert len(warned) == 2 and all(re.search(said % "when it was written", w) for w in warned), warned
    _flip_bits(store / "dist.npy", n=1, low=True)
    with pytest.raises(DamagedError) as e:
        load_trips(str(store))
    assert re.search(said % "at conversion", str(e.value)), str(e.value)


def test_verify_removes_a_damaged_derived_value(store, capsys):
    _derive(store)
    _flip_bits(_kept(store, "split") / "val.npy", n=1, low=True)
    assert main(["data", "verify", str(store)]) == 0
    out = capsys.readouterr()
    assert "val.npy: damaged" in out.err and "3 intact, 1 damaged and removed" in out.out
    assert not any(p.name.startswith("split-") for p in (store / "derived").iterdir())


def test_store_of_an_older_stfast_opens_with_a_warning(store, caplog):
    m = json.loads((store / MANIFEST).read_text())
    for k in ("files", "checks", "xxh3_64"):
        m.pop(k)
    (store / MANIFEST).write_text(json.dumps(m))
    with caplog.at_level(logging.WARNING, logger="stfast.data"):
        assert len(open_store(store)) == 200
    assert any("without checksums" in r.getMessage() for r in caplog.records)
    with pytest.raises(ValueError, match="without checksums"):
        from stfast.data.store import verify_store

        verify_store(store)



@pytest.mark.parametrize("workers", [1, 2, 4])
def test_checks_on_every_core_name_the_first_damage_in_order(made, store, monkeypatch, workers):
    """The checks of changed files run on the process's cores at once; the error is still the first in order: a
    value outside its range (lng.npy) before a checksum (dist.npy, a low bit flipped), whatever thread ends first."""
    from stfast.data import store_checks

    monkeypatch.setattr(store_checks, "_workers", lambda: workers)
    _flip_bits(store / "dist.npy", low=True)
    _flip_bits(store / "lng.npy")
    with pytest.raises(DamagedError, match="lng.npy"):
        open_store(store)
    (store / "lng.npy").write_bytes((made / "lng.npy").read_bytes())
    with pytest.raises(DamagedError, match=r"dist.npy.*checksum"):
        open_store(store)


def test_checks_not_started_when_one_fails_are_not_run(monkeypatch):
    """After the first failed check (in order) the checks not yet started are dropped: their outcome cannot change
    the error raised (before: every check of a 14 GB store ran to the end after the first damage was found)."""
    import time

    from stfast.data import store_checks

    monkeypatch.setattr(store_checks, "_workers", lambda: 1)
    ran = []

    def bad():
        raise DamagedError("lng.npy", "damaged")

    def slow(i):
        ran.append(i)
        time.sleep(0.2)

    tasks = [bad] + [lambda i=i: slow(i) for i in range(5)]
    with pytest.raises(DamagedError, match="lng.npy"):
        store_checks._in_order(tasks)
    assert len(ran) < 5, ran


def test_verify_of_a_missing_path_says_there_is_none(tmp_path, capsys):
    """Issue 62: `stfast data verify` of a path that does not exist says so (before: "is not a trips store (no
    manifest.json)", as if a folder were there); a folder that is not a store still gets that line."""
    from conftest import one_line_error

    err = one_line_error(capsys, main(["data", "verify", str(tmp_path / "nowhere.store")]))
    assert "nowhere.store: no such file or folder" in err and MANIFEST not in err, err
    err = one_line_error(capsys, main(["data", "verify", str(tmp_path)]))
    assert f"not a trips store (no {MANIFEST})" in err, err
