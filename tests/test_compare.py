"""`stfast compare CANDIDATE INCUMBENT --data RECENT` (issue 63 item 2): both models scored on the same trips, the
paired MAPE difference with a 95 % bootstrap interval, exit 0 only when the candidate is better by --min-gain, and
--promote replacing the served file atomically only then."""
import numpy as np
import pytest
from _accuracy import fresh_seed

from stfast.cli import main
from stfast.train.compare import bootstrap_gain, compare, promote


def _preds(seed, n=400):
    rng = np.random.default_rng(seed)
    true = rng.uniform(200, 2000, n)
    return true, true * rng.uniform(0.9, 1.1, n), true * rng.uniform(0.7, 1.3, n)  # true, good, worse


def test_a_better_candidate_passes_and_the_interval_holds_the_gain():
    seed = fresh_seed()
    true, good, worse = _preds(seed)
    r = compare(good, worse, true, seed=seed)
    assert r.better and r.low <= r.gain <= r.high and r.gain > 0.05, (seed, r)
    assert r.candidate["mape"] < r.incumbent["mape"]
    assert compare(good, worse, true, seed=seed) == r  # deterministic for a seed
    assert not compare(worse, good, true, seed=seed).better  # the other way round
    assert not compare(good, worse, true, min_gain=r.high, seed=seed).better  # not by that much
    lines = r.lines()
    assert lines[-1].startswith("better: ") and "points, 95 % interval" in lines[-2]


def test_a_model_is_never_better_than_itself():
    true, good, _ = _preds(fresh_seed())
    r = compare(good, good, true)
    assert r.gain == r.low == r.high == 0.0 and not r.better


def test_bootstrap_interval_is_near_the_normal_one():
    """For a mean of many independent trips the percentile interval is close to mean ± 1.96 σ/√T."""
    rng = np.random.default_rng(fresh_seed())
    a, b = rng.uniform(0, 0.4, 3000), rng.uniform(0, 0.3, 3000)
    low, high = bootstrap_gain(a, b, seed=1)
    d = a - b
    half = 1.96 * d.std(ddof=1) / np.sqrt(len(d))
    assert low == pytest.approx(d.mean() - half, abs=0.15 * half) and high == pytest.approx(d.mean() + half,
                                                                                               abs=0.15 * half)


def test_compare_refuses_bad_input():
    with pytest.raises(ValueError, match="same T"):
        compare(np.ones(3), np.ones(4), np.ones(3))
    with pytest.raises(ValueError, match="T ≥ 1"):
        bootstrap_gain(np.zeros(0), np.zeros(0))


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """A run trained 6 epochs and one stopped after 1 step (its MAPE far worse), on the same trips, and fresh
    trips of the same kind to compare them on."""
    from stfast.data.load import load_trips

    d = tmp_path_factory.mktemp("compare")
    data, recent = d / "trips.jsonl", d / "recent.jsonl"
    load_trips(None, n_synthetic=600, seed=41).to_jsonl(data)  # the synthetic city: travel times a model can learn
    load_trips(None, n_synthetic=200, seed=42).to_jsonl(recent)
    for name, extra in (("good", ["--epochs", "6"]), ("raw", ["--max-steps", "1"])):
        assert main(["train", "--data", str(data), "--batch-size", "32", "--out", str(d / name), "--no-progress",
                     "--threads", "1", "--seed", "3", *extra]) == 0
    return d, recent


def test_cli_gate_and_promote(two_runs, capsys):
    d, recent = two_runs
    good, raw = str(d / "good" / "checkpoint.pt"), str(d / "raw" / "checkpoint.pt")
    served = d / "served.pt"
    served.write_bytes((d / "raw" / "checkpoint.pt").read_bytes())
    capsys.readouterr()
    # the worse model as candidate: exit 1, nothing promoted
    assert main(["compare", raw, good, "--data", str(recent), "--promote", str(served)]) == 1
    out = capsys.readouterr().out
    assert "not better" in out and "promoted" not in out
    assert served.read_bytes() == (d / "raw" / "checkpoint.pt").read_bytes()
    # the better one: exit 0, and the served file is now it, byte for byte, with no temporary left beside it
    assert main(["compare", good, raw, "--data", str(recent), "--promote", str(served)]) == 0
    out = capsys.readouterr().out
    assert "\nbetter: " in out and f"promoted: {served}" in out
    assert served.read_bytes() == (d / "good" / "checkpoint.pt").read_bytes()
    assert sorted(p.name for p in d.iterdir() if p.is_file() and "served" in p.name) == ["served.pt"]
    # a model against itself is not better; an impossible gain is refused
    assert main(["compare", good, good, "--data", str(recent)]) == 1
    assert main(["compare", good, raw, "--data", str(recent), "--min-gain", "-1"]) == 2


def test_promote_refuses_a_missing_folder_and_the_candidate_itself(tmp_path):
    ck = tmp_path / "c.pt"
    ck.write_bytes(b"x" * 10)
    with pytest.raises(ValueError, match="no folder"):
        promote(ck, tmp_path / "nowhere" / "s.pt")
    with pytest.raises(ValueError, match="the candidate itself"):
        promote(ck, ck)


def test_a_kill_during_promote_leaves_the_old_file_or_the_new(tmp_path):
    """Issue 63: `--promote` killed (SIGKILL) while it copies leaves the served file whole and old, never a part;
    one left to finish leaves it new."""
    import os
    import signal
    import subprocess
    import sys
    import time

    old, new, served = tmp_path / "old.pt", tmp_path / "new.pt", tmp_path / "served.pt"
    old.write_bytes(b"o" * (1 << 20))
    new.write_bytes(os.urandom(1 << 20) * 256)  # 256 MiB: the copy takes long enough to be caught in it
    code = f"from stfast.train.compare import promote; promote({str(new)!r}, {str(served)!r})"
    served.write_bytes(old.read_bytes())
    p = subprocess.Popen([sys.executable, "-c", code])
    t0 = time.monotonic()
    while not [f for f in tmp_path.iterdir() if f.name.startswith(".served.pt.")] and time.monotonic() - t0 < 60:
        time.sleep(0.001)
    p.send_signal(signal.SIGKILL)  # mid-copy: its temporary exists
    p.wait()
    assert served.read_bytes() == old.read_bytes()
    p = subprocess.run([sys.executable, "-c", code], check=True)  # undisturbed: the new file, whole
    assert served.read_bytes() == new.read_bytes()
