"""benchmarks/gpu_check.sh, the GPU machine's one command: its --dry-run (every phase's command exists and
accepts its flags, with gymnasium unimportable as on the GPU machine; the budgets sum to <= 540 s) and its
driver (the report is rewritten after every phase; a timeout marks that phase and loses nothing earlier)."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
# the order issue 24 asks for: build, CUDA tests, probes of rows 1-4, memcheck, benchmarks, summary
ORDER = ["env", "build", "tests_cuda", "tests_comm", "tests_components", "probes", "memcheck", "bench_geo_conv",
         "bench_lstm", "bench_deeptte", "bench_streams", "summary"]


def _run(out: Path, *args, phases: str | None = None, timeout: float = 600):
    env = dict(os.environ, PYTHON=sys.executable)
    env.pop("GPU_CHECK_PHASES", None)
    if phases is not None:
        env["GPU_CHECK_PHASES"] = phases
    r = subprocess.run(["bash", str(SCRIPT), *args, str(out)], capture_output=True, text=True, env=env,
                       timeout=timeout)
    return r, json.loads((out / "gpu_report.json").read_text())


def test_dry_run_checks_every_phase_and_the_budget(tmp_path):
    r, rep = _run(tmp_path, "--dry-run")
    assert r.returncode == 0, r.stdout + r.stderr
    assert rep["dry_run"] is True and list(rep["phases"]) == ORDER
    assert rep["budget_sum_s"] == sum(p["budget_s"] for p in rep["phases"].values()) <= 540
    assert rep["phases"]["build"]["budget_s"] >= 150  # the build is inside the nine minutes
    for name, p in rep["phases"].items():
        assert p["status"] == "planned", (name, (tmp_path / p["log"]).read_text())
        assert p["command"].strip()
    assert "TORCH_CUDA_ARCH_LIST=9.0" in rep["phases"]["build"]["command"]
    assert "--batch 512" in rep["phases"]["bench_geo_conv"]["command"]
    assert (tmp_path / "gpu_check.log").read_text().count("[dry-run]") == len(ORDER)


def test_dry_run_fails_on_a_budget_over_nine_minutes_and_on_an_unknown_phase(tmp_path):
    r, rep = _run(tmp_path / "a", "--dry-run", phases="env:300 summary:300")
    assert r.returncode == 1 and rep["budget_sum_s"] == 600
    assert "600s > 540s" in r.stdout
    r = subprocess.run(["bash", str(SCRIPT), "--dry-run", str(tmp_path / "b")], capture_output=True, text=True,
                       env=dict(os.environ, PYTHON=sys.executable, GPU_CHECK_PHASES="env:5 nosuch:5"), timeout=60)
    assert r.returncode == 1 and "unknown phase 'nosuch'" in r.stdout


def test_run_records_each_phase_and_a_timeout_loses_nothing_earlier(tmp_path):
    # here (no GPU): env runs, the communicator's CUDA selection runs (its GPU tests skip), the components
    # phase cannot even start pytest in 1 s (a timeout), the summary runs after it
    r, rep = _run(tmp_path, phases="env:60 tests_comm:300 tests_components:1 summary:30")
    assert r.returncode == 1, r.stdout + r.stderr
    ph = rep["phases"]
    assert ph["env"]["status"] == "ok" and rep["results"]["env"]["python"] == sys.version.split()[0]
    assert ph["tests_comm"]["status"] == "ok", (tmp_path / ph["tests_comm"]["log"]).read_text()
    counts = ph["tests_comm"]["tests"]["tests_comm"]
    assert counts["tests"] > 0 and counts["failures"] == counts["errors"] == 0
    assert ph["tests_components"]["status"] == "timeout" and "timeout after 1s" in ph["tests_components"]["note"]
    assert ph["summary"]["status"] == "ok"
    s = rep["summary"]
    assert s["failed"] == ["tests_components"] and s["ok"] == ["env", "tests_comm"] and s["all_ok"] is False
    assert s["tests"]["tests_comm"]["passed"] == counts["passed"]
    log = (tmp_path / "gpu_check.log").read_text()
    assert "tests_components: TIMEOUT (1s)" in log and "env: ok" in log
