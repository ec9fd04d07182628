"""Conversions delete nothing stfast did not write and survive crashes (issue 53): `--out` is replaced only when it
holds a store and nothing else, a symbolic link is followed, a kill between the two renames of a store's swap is
undone by the next open, temporary folders of killed conversions are removed by the next one, and OS errors are
one line naming the path. Each test failed on the code before (the folder deleted, the link replaced, the store
left renamed aside, the folders left forever, a traceback)."""
from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest

from stfast.cli import main
from stfast.data import durable
from stfast.data.store import MANIFEST, open_store, write_store
from stfast.data.synthetic import synthetic_trips

RAW = "/dev/null"  # never read: every refusal comes before the input is opened


@pytest.fixture(scope="module")
def jsonl(tmp_path_factory):
    p = tmp_path_factory.mktemp("raw") / "trips.jsonl"
    synthetic_trips(60, seed=3).to_jsonl(p)
    return p


def _convert(data, out, capsys):
    rc = main(["data", "convert", "--data", str(data), "--out", str(out)])
    return rc, capsys.readouterr().err.strip()


@pytest.mark.parametrize("extra", ["notes.txt", "sub/"])
def test_a_store_with_the_users_files_is_not_replaced(tmp_path, jsonl, capsys, extra):
    store = tmp_path / "s"
    assert _convert(jsonl, store, capsys)[0] == 0
    (store / extra.rstrip("/")).mkdir() if extra.endswith("/") else (store / extra).write_text("mine")
    before = sorted(p.name for p in store.iterdir())
    rc, err = _convert(jsonl, store, capsys)
    assert rc == 2 and len(err.splitlines()) == 1 and extra.rstrip("/") in err and "did not write" in err, err
    assert sorted(p.name for p in store.iterdir()) == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_foreign_manifest_or_file_is_not_replaced(tmp_path, jsonl, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / MANIFEST).write_text('{"format": "mine"}')
    rc, err = _convert(jsonl, mine, capsys)
    assert rc == 2 and "not a stfast trips store" in err and (mine / MANIFEST).read_text() == '{"format": "mine"}'
    (tmp_path / "f").write_text("x")
    rc, err = _convert(jsonl, tmp_path / "f", capsys)
    assert rc == 2 and "not a folder" in err and (tmp_path / "f").read_text() == "x"


def test_an_empty_folder_or_a_store_alone_is_replaced(tmp_path, jsonl, capsys):
    (tmp_path / "e").mkdir()
    assert _convert(jsonl, tmp_path / "e", capsys)[0] == 0 and len(open_store(tmp_path / "e")) > 0
    open_store(tmp_path / "e")
    assert _convert(jsonl, tmp_path / "e", capsys)[0] == 0  # with its checked.json and derived/: all stfast's


def test_a_symlinked_out_is_followed(tmp_path, jsonl, capsys):
    (tmp_path / "real").mkdir()
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "real" / "store")
    assert _convert(jsonl, link, capsys)[0] == 0
    assert link.is_symlink() and (tmp_path / "real" / "store" / MANIFEST).is_file()
    assert _convert(jsonl, link, capsys)[0] == 0  # replaced again through the link
    assert link.is_symlink() and len(open_store(link)) > 0


def test_a_kill_between_the_swaps_renames_is_undone_by_the_next_open(tmp_path, jsonl):
    """A conversion killed (os._exit) after it renamed the old store aside and before it renamed the new one into
    place: the next open renames the old one back; the next conversion replaces it."""
    old = write_store(synthetic_trips(40, seed=1), tmp_path / "s")
    code = ("import os, sys; from stfast.data import durable; from stfast.data.store import write_store; "
            "from stfast.data.synthetic import synthetic_trips\n"
            "real = os.replace\n"
            "def replace(a, b):\n"
            "    real(a, b)\n"
            "    if '.old' in str(b): os._exit(9)\n"
            "durable.os.replace = replace\n"
            f"write_store(synthetic_trips(50, seed=2), {str(tmp_path / 's')!r})\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", code], env=env, timeout=300, capture_output=True, text=True)
    assert r.returncode == 9, r.stderr
    assert not (tmp_path / "s").exists() and [p.name for p in tmp_path.iterdir() if ".s.old" in p.name]
    again = open_store(tmp_path / "s")
    assert again.fingerprint == old.fingerprint
    assert [p.name for p in tmp_path.iterdir() if ".s.old" in p.name] == []
    write_store(synthetic_trips(50, seed=2), tmp_path / "s")  # the killed one's complete new store: removed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]


def test_leftovers_of_killed_conversions_are_removed_by_the_next(tmp_path, jsonl, capsys):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    tmp, spill = tmp_path / f".other.tmp{dead}", tmp_path / f".s.spill{dead}"
    tmp.mkdir()
    (tmp / "lng.npy").write_bytes(b"x")
    (tmp / "_driver.3.npy").write_bytes(b"x")
    spill.mkdir()
    (spill / "17.bin").write_bytes(b"x")
    alive = tmp_path / f".t.tmp{os.getpid()}"  # a conversion still running (this process)
    alive.mkdir()
    foreign = tmp_path / f".x.tmp{dead}"  # not a conversion's: a file it never writes
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    assert _convert(jsonl, tmp_path / "s", capsys)[0] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["s", alive.name, foreign.name])


def test_the_temporaries_of_a_killed_convert_not_yet_waited_for_are_removed_by_the_next(tmp_path, jsonl, capsys):
    """A convert killed while writing ``.k.store.tmpPID``, its exit not yet collected by its parent (a zombie: the
    pid still answers a signal), is dead: the next convert into the same parent, under another store's name,
    removes its temporary folder (before: it stayed beside ``small.store``)."""
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        killed.kill()
        os.waitid(os.P_PID, killed.pid, os.WEXITED | os.WNOWAIT)  # ended, not collected: a zombie
        os.kill(killed.pid, 0)  # its pid is still there
        tmp = tmp_path / f".k.store.tmp{killed.pid}"
        tmp.mkdir()
        for name in ("lng.npy", "_lengths.npy", "_trip_id.0.npy", f".checked.json.tmp{killed.pid}"):
            (tmp / name).write_bytes(b"x")
        assert _convert(jsonl, tmp_path / "small.store", capsys)[0] == 0
        assert sorted(p.name for p in tmp_path.iterdir()) == ["small.store"]
    finally:
        killed.wait()


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EBUSY])
def test_os_errors_are_one_line_naming_the_path(tmp_path, jsonl, capsys, monkeypatch, code):
    real = durable.os.replace

    def fail(a, b):
        raise OSError(code, os.strerror(code), str(b))

    monkeypatch.setattr(durable.os, "replace", fail)
    rc, err = _convert(jsonl, tmp_path / "s", capsys)
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith(f"stfast: error: cannot write the trips store {tmp_path / 's'}: {tmp_path / 's'}: "
                          f"{os.strerror(code)}; "), err
    monkeypatch.setattr(durable.os, "replace", real)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # the refused conversion left nothing


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_read_only_parent_is_one_line(tmp_path, jsonl, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        rc, err = _convert(jsonl, ro / "s", capsys)
    finally:
        ro.chmod(0o755)
    assert rc == 2 and str(ro) in err and len(err.splitlines()) == 1


def test_store_files_are_fsynced_before_the_rename(tmp_path, monkeypatch):
    """Every file of the new store and its folder are fsynced before the rename that makes it the store."""
    order = []
    real_fsync, real_replace = durable.os.fsync, durable.os.replace
    monkeypatch.setattr(durable.os, "fsync", lambda fd: order.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
                        or real_fsync(fd))
    monkeypatch.setattr(durable.os, "replace", lambda a, b: order.append(("replace", str(a))) or real_replace(a, b))
    write_store(synthetic_trips(30, seed=1), tmp_path / "s")
    renamed = order.index(("replace", str(tmp_path / f".s.tmp{os.getpid()}")))
    synced = {os.path.basename(p) for k, p in order[:renamed] if k == "fsync"}
    assert {p.name for p in (tmp_path / "s").iterdir()} <= synced | {"checked.json"}
    assert f".s.tmp{os.getpid()}" in synced and ("fsync", str(tmp_path)) in order[renamed:]


def test_jsonl_out_os_error_is_one_line_and_leaves_nothing(tmp_path, jsonl, capsys, monkeypatch):
    import stfast.data.trips as trips_mod

    def full(a, b):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(b))

    monkeypatch.setattr(trips_mod.os, "replace", full)
    rc, err = _convert(jsonl, tmp_path / "t.jsonl", capsys)
    assert rc == 2 and len(err.splitlines()) == 1 and f"cannot write {tmp_path / 't.jsonl'}" in err
    assert "disk is full" in err and list(tmp_path.iterdir()) == []


def test_an_os_error_on_a_relative_out_is_named_as_a_write(tmp_path, jsonl, capsys, monkeypatch):
    """``--out s`` (in the working folder) whose replacement failed (EBUSY: the store folder is a mount point) was
    reported as ``cannot read <the input>: s: Device or resource busy``: the error's path was tested as text
    against ``.``, the out's parent. Now it is named as the write it was."""
    monkeypatch.chdir(tmp_path)
    assert _convert(jsonl, "s", capsys)[0] == 0

    def busy(a, b):
        raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), str(a))

    monkeypatch.setattr(durable.os, "replace", busy)
    rc, err = _convert(jsonl, "s", capsys)
    assert rc == 2 and err == (f"stfast: error: cannot write the trips store s: s: {os.strerror(errno.EBUSY)}; a mount "
                               "point (or a path in use) cannot be replaced: write to a folder inside it, or to a new "
                               "path"), err


@pytest.mark.parametrize("store", [False, True])
def test_a_mount_point_out_is_refused_before_reading_naming_a_folder_inside(tmp_path, capsys, monkeypatch, store):
    """``--out DIR`` where DIR is a bind mount's folder (read-only or not): the conversion wrote its store beside it,
    then failed to rename DIR aside (EBUSY, "Device or resource busy"). Now refused before the input is read, in one
    line naming DIR and the fix, writing nothing. (A test cannot mount: os.path.ismount says DIR is one.)"""
    out = tmp_path / "mnt"
    if store:
        write_store(synthetic_trips(10, seed=1), out)
    else:
        out.mkdir()
    real = os.path.ismount
    monkeypatch.setattr(os.path, "ismount", lambda p: os.path.abspath(p) == str(out) or real(p))
    before = sorted(p.name for p in tmp_path.rglob("*"))
    rc, err = _convert(RAW, out, capsys)
    assert rc == 2 and err == (f"stfast: error: --out {out} is a mount point, which a conversion cannot replace (it "
                               f"writes the store beside it, then renames it into place): write to a folder inside it "
                               f"(--out {out / 'store'}) or to a new path"), err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize("name", ["sub.store", "sub.jsonl", "a/b.jsonl"])
def test_an_out_under_a_file_is_refused_before_reading_naming_the_file(tmp_path, capsys, name):
    """``--out FILE/sub.store`` was reported as a read error of the input (``cannot read DATA: FILE: File exists``),
    ``--out FILE/sub.jsonl`` after the whole input was read, naming a temporary (``FILE/sub.jsonl.tmpPID: Not a
    directory``). Now both are refused before the input is opened, naming --out and the file."""
    f = tmp_path / "notes.txt"
    f.write_text("mine")
    rc, err = _convert(RAW, f / name, capsys)
    assert rc == 2 and err == (f"stfast: error: --out {f / name}: {f} is a file, not a folder, so nothing can be "
                               "written under it; choose a path in a folder"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"] and f.read_text() == "mine"


def test_a_jsonl_out_replaces_only_deeptte_json_lines(tmp_path, jsonl, capsys):
    """``--out NAME.jsonl`` replaced whatever file was there (a user's notes: lost) and, on a folder, failed after
    reading the whole input; now both are refused before the input is opened. JSON lines (an earlier conversion's
    output) are still replaced."""
    notes, folder, earlier = tmp_path / "notes.jsonl", tmp_path / "d.jsonl", tmp_path / "t.jsonl"
    notes.write_text("my notes\n")
    folder.mkdir()
    rc, err = _convert(RAW, notes, capsys)
    assert rc == 2 and err == (f"stfast: error: --out {notes} exists and is not DeepTTE JSON lines (a file of yours "
                               "would be lost): choose a new file name"), err
    rc, err = _convert(RAW, folder, capsys)
    assert rc == 2 and f"--out {folder} is a folder" in err and len(err.splitlines()) == 1, err
    assert notes.read_text() == "my notes\n" and list(folder.iterdir()) == []
    earlier.write_text('{"old": 1}\n')
    assert _convert(jsonl, earlier, capsys)[0] == 0 and earlier.read_text() != '{"old": 1}\n'


def test_a_missing_folder_met_while_writing_is_named_as_a_write(tmp_path, jsonl, capsys, monkeypatch):
    """A FileNotFoundError of the store's own temporary folder (its parent gone, as under /proc) passed through raw:
    ``[Errno 2] No such file or directory: '…/.s.tmpPID'``; now the one line of a failed write."""
    real = durable.os.replace

    def gone(a, b):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(a))

    monkeypatch.setattr(durable.os, "replace", gone)
    rc, err = _convert(jsonl, tmp_path / "s", capsys)
    monkeypatch.setattr(durable.os, "replace", real)
    assert rc == 2 and err.startswith(f"stfast: error: cannot write the trips store {tmp_path / 's'}: "), err
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("onto_itself", [False, True])
def test_a_store_given_as_data_is_named_as_one(tmp_path, capsys, onto_itself):
    """``--data STORE --out OTHER.store`` (or onto itself) said ``STORE: could not recognize the format (directory holds
    neither .plt, gps_* …)``; a store is read as it is (``--out NAME.jsonl`` writes its trips), so the line says so."""
    store = tmp_path / "s"
    write_store(synthetic_trips(10, seed=1), store)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    rc, err = _convert(store, store if onto_itself else tmp_path / "t", capsys)
    assert rc == 2 and err == (f"stfast: error: --data {store} is a trips store already: train, evaluate or predict on "
                               "it as it is (an --out ending in .jsonl writes its trips as DeepTTE JSON lines)"), err
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before
