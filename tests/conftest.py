import json
import os
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests: CI runs a fixed (derandomized) set of examples so that a landing is reproducible; local
# runs explore new examples each time (and keep failures in .hypothesis/).
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI", "").lower() == "true":
    settings.load_profile("ci")


def pytest_runtest_logreport(report):
    """With STFAST_TEST_RESULTS_JSONL=FILE, each test's outcome is appended to FILE (one JSON object a line:
    test, outcome passed/failed/skipped/error, seconds, message) the moment it is known: a pytest killed at
    its time limit writes no junit, and benchmarks/gpu_check.sh still reports the tests that ran."""
    path = os.environ.get("STFAST_TEST_RESULTS_JSONL")
    if not path or not (report.when == "call" or report.failed or report.skipped):
        return  # one line per test: its call, or the setup / teardown that failed or skipped it
    outcome = "error" if report.failed and report.when != "call" else report.outcome
    message = ""
    if report.failed and report.longrepr:  # the exception's own line ("AssertionError: ..."), else the last
        crash = getattr(getattr(report.longrepr, "reprcrash", None), "message", None)
        message = (crash or (str(report.longrepr).strip().splitlines() or [""])[-1])[:300]
    elif report.skipped and isinstance(report.longrepr, tuple):
        message = str(report.longrepr[2])[:300]
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"test": report.nodeid, "outcome": outcome, "when": report.when,
                            "seconds": round(report.duration, 3), "message": message}) + "\n")


def _shared_data_dir() -> Path | None:
    env = os.environ.get("STFAST_DATA_DIR")
    cands = [Path(env)] if env else []
    here = Path(__file__).resolve().parent.parent
    cands += [here.parent / "shared" / "data", here / ".." / "shared" / "data"]
    for c in cands:
        if c.is_dir():
            return c.resolve()
    return None


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data (or $STFAST_DATA_DIR). Fails under CI=true when missing, skips elsewhere."""
    d = _shared_data_dir()
    if d is None:
        msg = "real data not found: set STFAST_DATA_DIR or place ../shared/data beside the checkout"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return d


@pytest.fixture
def fresh_gemm_choices():
    """Every CPU GEMM library choice forgotten before and after the test (stfast.ops.gemm): choices a test pins
    do not leak into the next one."""
    from stfast.ops.gemm import reset_gemm_library

    reset_gemm_library()
    yield
    reset_gemm_library()


def require_gemm_library(library: str, dtype=None, out=None) -> None:
    """Skip unless CPU GEMM ``library`` takes ``dtype`` operands (default float32) with an ``out`` output here,
    saying why (the paths this CPU lacks run on the CPUs that have them, and by capping oneDNN in subprocesses)."""
    import torch

    from stfast.ops.gemm import gemm_libraries_available

    dtype = torch.float32 if dtype is None else dtype
    if library not in gemm_libraries_available(dtype, out):
        why = {"onednn": "torch's oneDNN matmul needs AVX-512 BW/VL/DQ, AVX-NE-CONVERT or Graviton3",
               "brgemm": "oneDNN's micro-kernel takes 16-bit operands from AVX512-BF16 up (its exact self-check "
                         "failed here; the reference seam runs this path on any CPU)"}
        pytest.skip(f"{library} does not take {dtype} on this CPU: {why.get(library, '')}")


def one_line_error(capsys, rc, expect_rc=2) -> str:
    """The CLI's stderr after it returned ``rc``: exactly one line, and ``rc`` is ``expect_rc``."""
    err = capsys.readouterr().err.strip()
    assert rc == expect_rc, err
    assert len(err.splitlines()) == 1 and err.startswith("stfast: error: "), err
    return err


def random_trips(n_trips: int, seed: int = 0, min_len: int = 3, max_len: int = 40, n_drivers: int = 8):
    """Fresh random (never zero) trips around Chengdu: realistic gaps, cumulative time/dist."""
    import numpy as np

    from stfast.data.trips import Trips, lengths_to_offsets

    rng = np.random.default_rng(seed)
    lens = rng.integers(min_len, max_len + 1, n_trips)
    off = lengths_to_offsets(lens)
    n = int(off[-1])

    def cum(lo, hi):
        steps = rng.uniform(lo, hi, n)
        steps[off[:-1]] = 0.0
        out = np.cumsum(steps)
        return out - np.repeat(out[off[:-1]], lens)

    tg, dg = cum(10, 90), cum(0.1, 0.5)
    return Trips(off, 104.06 + rng.normal(0, 0.05, n), 30.66 + rng.normal(0, 0.04, n),
                 rng.integers(0, 2, n).astype(np.float32), tg, dg, dg[off[1:] - 1] * 0.999,
                 tg[off[1:] - 1], np.array([f"d{i}" for i in rng.integers(0, n_drivers, n_trips)], object),
                 rng.integers(0, 7, n_trips), rng.integers(0, 1440, n_trips), rng.integers(24, 31, n_trips))
