"""Issue 52, item 2: every subcommand against each wrong kind of path (a file where a folder is wanted, a folder
where a file is wanted, a trips store, a checkpoint, a run folder, a missing path, a path under a file) refuses in one line on stderr,
exit 2, no traceback, and writes nothing: no file changed, no folder created, no lock file left behind.

In-process (one interpreter: the model layers are imported once); `serve` never binds (uvicorn's run fails the
test if a wrong path got that far)."""
import pytest

from conftest import one_line_error, random_trips
from stfast.cli import main

KINDS = ("file", "folder", "store", "checkpoint", "run", "missing", "under_file")


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    """Each kind of path, and valid ones (``data``, ``ck``) to pair with the wrong one."""
    d = tmp_path_factory.mktemp("paths")
    data = d / "trips.jsonl"
    random_trips(90, seed=31, max_len=20).to_jsonl(data)
    assert main(["train", "--data", str(data), "--max-steps", "1", "--batch-size", "32", "--out", str(d / "run"),
                 "--no-progress", "--threads", "1"]) == 0
    assert main(["data", "convert", "--data", str(data), "--out", str(d / "store")]) == 0
    (d / "notes.txt").write_text("hello\n")
    (d / "empty").mkdir()
    kinds = {"file": d / "notes.txt", "folder": d / "empty", "store": d / "store", "checkpoint": d / "run" / "checkpoint.pt",
             "run": d / "run", "missing": d / "nowhere" / "x", "under_file": d / "notes.txt" / "x"}
    return d, {k: str(v) for k, v in kinds.items()}, str(data), str(d / "run" / "checkpoint.pt")


def _cases(d, data, ck):
    """(command, slot) → (argv for a path, the kinds that are wrong there). Valid partners: --data the JSON lines,
    --checkpoint the run's; outputs that a refusal must not create: under d/new."""
    new = str(d / "new")
    fast = ["--max-steps", "1", "--no-progress", "--threads", "1"]  # were a wrong path accepted: a short run
    data_kinds = ("file", "folder", "checkpoint", "run", "missing")  # a store is data
    ck_kinds = ("file", "folder", "store", "run", "missing")
    return {
        ("train", "--data"): (lambda p: ["train", "--data", p, "--out", new, *fast], data_kinds),
        ("train", "--out"): (lambda p: ["train", "--data", data, "--out", p, *fast],
                             ("file", "store", "checkpoint", "run", "under_file")),
        ("evaluate", "--checkpoint"): (lambda p: ["evaluate", "--checkpoint", p, "--data", data], ck_kinds),
        ("evaluate", "--data"): (lambda p: ["evaluate", "--checkpoint", ck, "--data", p], data_kinds),
        ("predict", "--checkpoint"): (lambda p: ["predict", "--checkpoint", p, "--data", data, "--out", new + ".csv"],
                                      ck_kinds),
        ("predict", "--data"): (lambda p: ["predict", "--checkpoint", ck, "--data", p, "--out", new + ".csv"], data_kinds),
        ("predict", "--out"): (lambda p: ["predict", "--checkpoint", ck, "--data", data, "--out", p],
                               ("file", "folder", "store", "checkpoint", "run", "missing", "under_file")),
        ("serve", "--checkpoint"): (lambda p: ["serve", "--checkpoint", p, "--port", "1"], ck_kinds),
        ("serve", "--token-file"): (lambda p: ["serve", "--checkpoint", ck, "--token-file", p, "--port", "1"],
                                    ("folder", "store", "checkpoint", "run", "missing")),
        ("report", "RUN_DIR"): (lambda p: ["report", p, "--out", new], ("file", "folder", "store", "checkpoint", "missing")),
        ("report", "RUN_DIR alone"): (lambda p: ["report", p], ("file", "folder", "store", "checkpoint", "missing")),
        ("report", "--out"): (lambda p: ["report", str(d / "run"), "--out", p],
                              ("file", "store", "checkpoint", "under_file")),
        ("data convert", "--data"): (lambda p: ["data", "convert", "--data", p, "--out", new], data_kinds),
        # an empty folder is a valid --out of convert (issue 53: new, empty, or a store of nothing else)
        ("data convert", "--out"): (lambda p: ["data", "convert", "--data", data, "--out", p],
                                    ("file", "checkpoint", "run", "under_file")),
        ("data convert", "--out .jsonl"): (lambda p: ["data", "convert", "--data", data, "--out", p + ".jsonl"],
                                           ("under_file",)),
        ("bench modes", "--data"): (lambda p: ["bench", "modes", "--data", p, "--out", new, "--budget-s", "1"],
                                    data_kinds),
        ("bench modes", "--out"): (lambda p: ["bench", "modes", "--out", p, "--budget-s", "1"],
                                   ("file", "store", "checkpoint", "run", "under_file")),
    }


def _snapshot(d):
    return {str(p): (p.stat().st_mtime_ns, p.stat().st_size) for p in d.rglob("*")}


def test_every_subcommand_refuses_every_wrong_path_in_one_line_writing_nothing(paths, capsys, monkeypatch):
    uvicorn = pytest.importorskip("uvicorn")

    def bound(self, *a, **k):
        raise AssertionError("serve got as far as binding a port")

    monkeypatch.setattr(uvicorn.Server, "run", bound)
    d, kinds, data, ck = paths
    capsys.readouterr()
    failures, n = [], 0
    for (command, slot), (argv, wrong) in _cases(d, data, ck).items():
        for kind in wrong:
            n += 1
            before = _snapshot(d)
            try:
                rc = main(argv(kinds[kind]))
            except SystemExit as e:  # argparse
                rc = e.code
            except Exception as e:  # a traceback for the user
                rc = f"{type(e).__name__}: {e}"
            err = capsys.readouterr().err.strip()
            after = _snapshot(d)
            changed = sorted(set(before) ^ set(after)) + sorted(k for k in before if k in after and before[k] != after[k])
            if rc != 2 or len(err.splitlines()) != 1 or not err.startswith("stfast: error: ") or changed:
                failures.append(f"{command} {slot}={kind}: rc {rc}, stderr {err[-300:]!r}, changed {changed[:3]}")
    assert n == 81 and not failures, "\n".join(failures)


def test_the_refusals_name_the_kind_of_path_given(paths, capsys):
    """A checkpoint or a run folder given as --data is named as such (not 'could not recognize' and a zip's
    bytes), a store given as --checkpoint is not told to try a STORE/checkpoint.pt that does not exist."""
    d, kinds, data, ck = paths
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", ck, "--data", kinds["checkpoint"]]) == 2
    err = one_line_error(capsys, 2)
    assert "is a stfast checkpoint" in err and "--checkpoint" in err and "\\x" not in err
    assert main(["evaluate", "--checkpoint", ck, "--data", kinds["run"]]) == 2
    err = one_line_error(capsys, 2)
    assert "is the folder of a training run" in err and "checkpoint.pt" in err
    assert main(["evaluate", "--checkpoint", kinds["store"], "--data", data]) == 2
    err = one_line_error(capsys, 2)
    assert "is a trips store" in err and "store/checkpoint.pt" not in err and "--data" in err
    assert main(["evaluate", "--checkpoint", kinds["run"], "--data", data]) == 2
    assert f"e.g. {kinds['run']}/checkpoint.pt" in one_line_error(capsys, 2)  # that one exists: named
    assert main(["evaluate", "--checkpoint", kinds["folder"], "--data", data]) == 2
    assert "empty/checkpoint.pt" not in one_line_error(capsys, 2)  # none there: not suggested


def test_refusals_in_a_fresh_process_end_in_one_error_line(paths):
    """The same, as a user runs it (`python -m stfast.cli`, the log on stderr): no traceback, one error line, the
    only other lines the log's own (``stfast: <file>: reading as ...``)."""
    import subprocess
    import sys

    d, kinds, data, ck = paths
    for argv in (["evaluate", "--checkpoint", kinds["store"], "--data", data],
                 ["predict", "--checkpoint", ck, "--data", data, "--out", kinds["checkpoint"]],
                 ["serve", "--checkpoint", ck, "--token-file", kinds["folder"], "--port", "1"]):
        got = subprocess.run([sys.executable, "-m", "stfast.cli", *argv], capture_output=True, text=True, timeout=120)
        lines = got.stderr.strip().splitlines()
        assert got.returncode == 2 and "Traceback" not in got.stderr, got.stderr
        assert [x for x in lines if x.startswith("stfast: error: ")] == lines[-1:], got.stderr
        assert all(x.startswith("stfast: ") for x in lines), got.stderr
