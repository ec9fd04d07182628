#!/usr/bin/env bash
# GPU check: on a machine with an NVIDIA GPU, build stfast from source against the installed torch,
# run the CUDA tests and the CUDA benchmarks, and write a JSON summary into OUTDIR.
#   bash benchmarks/gpu_check.sh OUTDIR        (< 8 min on an H200; sm_90 only, to compile fast)
set -uo pipefail
OUT="${1:?usage: gpu_check.sh OUTDIR}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" STFAST_CUDA=1 MAX_JOBS="${MAX_JOBS:-16}"
start=$(date +%s)
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
# Build in place (the source tree's stfast/_C*.so), against the python3 + torch of this machine.
$PY setup.py build_ext --inplace > "$OUT/build.log" 2>&1
build_rc=$?
build_s=$(( $(date +%s) - start ))
tests_rc=1; bench_rc=1
if [ $build_rc -eq 0 ]; then
  timeout 240 $PY -m pytest -q tests/test_geo_conv.py tests/test_lstm.py tests/test_build.py -k "cuda or build" \
    --junitxml="$OUT/tests.xml" > "$OUT/tests.log" 2>&1
  tests_rc=$?
  # communicator: NCCL world-size-1 collectives (vs torch NCCL and cupy.cuda.nccl) and the build report
  timeout 180 $PY -m pytest -q tests/test_comm.py -k "cuda or build or nccl" \
    --junitxml="$OUT/tests_comm.xml" > "$OUT/tests_comm.log" 2>&1
  [ $? -eq 0 ] || tests_rc=1
  # component parallelism: the streams plan (and two GPUs where present) equals the plain model; racecheck
  # (shared-memory races inside kernels) where compute-sanitizer runs
  timeout 240 $PY -m pytest -q tests/test_components.py -k "cuda or gpu" \
    --junitxml="$OUT/tests_components.xml" > "$OUT/tests_components.log" 2>&1
  [ $? -eq 0 ] || tests_rc=1
  if command -v compute-sanitizer > /dev/null; then
    timeout 300 compute-sanitizer --tool racecheck $PY -m pytest -q tests/test_components.py \
      -k "cuda_streams" > "$OUT/racecheck_components.log" 2>&1
  fi
  timeout 180 $PY benchmarks/bench_geo_conv.py --device cuda --batch 512 --json "$OUT/bench_cuda.json" \
    > "$OUT/bench_cuda.txt" 2>&1
  bench_rc=$?
  timeout 120 $PY benchmarks/bench_comm.py --gpu --rounds 3 --json "$OUT/bench_comm.json" > "$OUT/bench_comm.txt" 2>&1
  [ $? -eq 0 ] || bench_rc=1
  # Fused LSTM vs cuDNN (H = 128, B = 64/256; CUDA-synchronized medians of interleaved rounds after warm-up)
  timeout 180 $PY benchmarks/bench_lstm.py --device cuda --skip-e2e --json "$OUT/bench_lstm_cuda.json" \
    > "$OUT/bench_lstm_cuda.txt" 2>&1
  [ $? -eq 0 ] || bench_rc=1
  timeout 60 $PY - > "$OUT/bandwidth.json" 2>>"$OUT/bench_cuda.txt" <<'PYEOF'
import json, torch
x = torch.empty(256 * 2**20, dtype=torch.float32, device="cuda"); y = torch.empty_like(x)
for _ in range(3): y.copy_(x)
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
s.record()
for _ in range(20): y.copy_(x)
e.record(); torch.cuda.synchronize()
print(json.dumps({"copy_GBps": 2 * x.numel() * 4 * 20 / (s.elapsed_time(e) / 1e3) / 1e9}))
PYEOF
fi
$PY - "$OUT" "$build_rc" "$tests_rc" "$bench_rc" "$build_s" "$(( $(date +%s) - start ))" <<'PYEOF'
import json, sys
from pathlib import Path
out, build_rc, tests_rc, bench_rc, build_s, total_s = sys.argv[1], *map(int, sys.argv[2:])
def load(name):
    p = Path(out) / name
    try:
        return json.loads(p.read_text())
    except Exception:
        return None
summary = {"build_rc": build_rc, "build_s": build_s, "tests_rc": tests_rc, "bench_rc": bench_rc, "total_s": total_s,
           "bench_cuda": load("bench_cuda.json"), "bandwidth": load("bandwidth.json"),
           "bench_comm": load("bench_comm.json"), "bench_lstm_cuda": load("bench_lstm_cuda.json")}
try:
    import torch, stfast
    summary.update(torch=torch.__version__, build_info=stfast.build_info(), gpu=torch.cuda.get_device_name())
except Exception as e:  # noqa: BLE001
    summary["import_error"] = repr(e)
(Path(out) / "summary.json").write_text(json.dumps(summary, indent=1))
print(json.dumps(summary, indent=1))
PYEOF
[ $build_rc -eq 0 ] && [ $tests_rc -eq 0 ] && [ $bench_rc -eq 0 ]
