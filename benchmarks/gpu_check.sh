#!/usr/bin/env bash
# GPU check (issue 24): the one command a GPU machine runs. One H200 (sm_90), 16 cores, python3 3.12 with
# torch + CUDA preinstalled, no network, no gymnasium. Phases, each with its own time budget (a timeout),
# in this order: build (sm_90 only, all cores) -> CUDA correctness tests -> probes of issue 24 rows 1-4 ->
# compute-sanitizer memcheck of both ops -> CUDA benchmarks (CUDA events) -> summary. The budgets sum to
# <= 540 s (9 minutes, build included), and no phase runs past the 540 s deadline counted from the start.
# OUTDIR/gpu_report.json and OUTDIR/gpu_check.log are written after every phase, so a late timeout loses
# nothing earlier; each phase's output is in OUTDIR/logs/<phase>.log.
#
#   bash benchmarks/gpu_check.sh OUTDIR             the run
#   bash benchmarks/gpu_check.sh --dry-run OUTDIR   on a CPU machine / CI: checks that every phase's command
#                                                   exists and accepts its flags and that the budgets sum to
#                                                   <= 540 s; writes the plan to OUTDIR/gpu_report.json
#
# Exit status: 0 when every phase passed or was skipped with a note (memcheck where compute-sanitizer is
# absent or refused), 1 otherwise. Python: $PYTHON (default python3).
#
# Test selections: the probes phase runs the CUDA tests of tests/test_geo_conv.py whose names match
# PROBE_K (input validation and degenerate sizes: rows 1-4); the CUDA correctness phase runs the other
# CUDA tests of tests/test_geo_conv.py and tests/test_lstm.py (bf16/fp16 included).
set -uo pipefail

DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; shift; fi
OUT="${1:?usage: gpu_check.sh [--dry-run] OUTDIR}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
TASKS=benchmarks/gpu_check_tasks.py
TOTAL_BUDGET=540
PROBE_K="cuda and (invalid or reject or degenerate or padded_lengths or short_trip or miss_points)"
CUDA_K="cuda and not (invalid or reject or degenerate or padded_lengths or short_trip or miss_points)"
export PY OUT TASKS PROBE_K CUDA_K
mkdir -p "$OUT/logs" "$OUT/junit" "$OUT/results"

# name:budget_s, in the order they run ($GPU_CHECK_PHASES, the same format, overrides: the tests use it)
PHASES=(env:5 build:200 tests_cuda:55 tests_comm:25 tests_components:25 probes:30 memcheck:60
        bench_geo_conv:50 bench_lstm:40 bench_deeptte:20 bench_streams:20 summary:5)
if [ -n "${GPU_CHECK_PHASES:-}" ]; then read -ra PHASES <<< "$GPU_CHECK_PHASES"; fi

pytest_phase() {  # name, then pytest arguments
  local name=$1; shift
  "$PY" -m pytest -q -p no:cacheprovider "$@" --junitxml="$OUT/junit/$name.xml"
}
pytest_check() {  # collect only: the files import and the selection parses (rc 5: none selected here)
  "$PY" -m pytest -q -p no:cacheprovider --collect-only "$@" > /dev/null
  local rc=$?
  [ $rc -eq 0 ] || [ $rc -eq 5 ]
}
has_flags() {  # script, flags...: the script's --help lists every flag
  local script=$1; shift
  local help
  help="$("$PY" "$script" --help 2>&1)" || { echo "$script --help failed: $help"; return 1; }
  for f in "$@"; do
    grep -q -- "$f" <<< "$help" || { echo "$script does not accept $f"; return 1; }
  done
}
export -f pytest_phase pytest_check has_flags

# ---- each phase: phase_<name> runs it (in its own bash, under its timeout), check_<name> dry-runs it
phase_env() { nvidia-smi > "$OUT/logs/nvidia-smi.txt" 2>&1; "$PY" "$TASKS" env --json "$OUT/results/env.json"; }
check_env() { has_flags "$TASKS" record summary env probes memcheck-target deeptte streams; }

phase_build() {
  STFAST_CUDA=1 TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS="$(nproc)" "$PY" setup.py build_ext --inplace || return 1
  "$PY" -c "import sys, stfast; i = stfast.build_info(); print(i); sys.exit(0 if i['cuda'] and i['nccl'] else 1)"
}
check_build() { [ -f setup.py ] && [ -f CMakeLists.txt ] && "$PY" -c "import setuptools, torch"; }

phase_tests_cuda() { pytest_phase tests_cuda tests/test_geo_conv.py tests/test_lstm.py -k "$CUDA_K"; }
check_tests_cuda() { pytest_check tests/test_geo_conv.py tests/test_lstm.py -k "$CUDA_K"; }

# the communicator at world size 1 (NCCL vs torch's NCCL and cupy) and the build report
phase_tests_comm() { pytest_phase tests_comm tests/test_comm.py -k "cuda or nccl or build"; }
check_tests_comm() { pytest_check tests/test_comm.py -k "cuda or nccl or build"; }

phase_tests_components() { pytest_phase tests_components tests/test_components.py -k "cuda_streams"; }
check_tests_components() { pytest_check tests/test_components.py -k "cuda_streams"; }

phase_probes() {
  pytest_phase probes tests/test_geo_conv.py -k "$PROBE_K"
  local rc=$?
  [ $rc -eq 5 ] && echo "no probe tests selected by: $PROBE_K"
  "$PY" "$TASKS" probes --json "$OUT/results/probes.json" || return 1
  [ $rc -eq 0 ] || [ $rc -eq 5 ]
}
check_probes() { pytest_check tests/test_geo_conv.py -k "$PROBE_K" && has_flags "$TASKS" probes; }

# exit 77: skipped (no compute-sanitizer, or it refused to run); 3: memory errors found
phase_memcheck() {
  if ! command -v compute-sanitizer > /dev/null; then echo "compute-sanitizer not found"; return 77; fi
  compute-sanitizer --tool memcheck --error-exitcode 3 --leak-check no --report-api-errors no \
    "$PY" "$TASKS" memcheck-target
  local rc=$?
  if [ $rc -ne 0 ] && [ $rc -ne 3 ] && [ $rc -ne 124 ] && [ $rc -ne 137 ]; then
    echo "compute-sanitizer refused or failed to run the target (rc $rc)"; return 77
  fi
  return $rc
}
check_memcheck() { has_flags "$TASKS" memcheck-target; }

phase_bench_geo_conv() {
  "$PY" benchmarks/bench_geo_conv.py --device cuda --batch 512 --shapes chengdu \
    --json "$OUT/results/bench_geo_conv.json"
}
check_bench_geo_conv() { has_flags benchmarks/bench_geo_conv.py --device --batch --shapes --json; }

# fused LSTM vs cuDNN, packed and padded, H = 128, B = 64 / 256 (and GeoLife-like B = 64)
phase_bench_lstm() {
  "$PY" benchmarks/bench_lstm.py --device cuda --rounds 3 --skip-e2e --json "$OUT/results/bench_lstm.json"
}
check_bench_lstm() { has_flags benchmarks/bench_lstm.py --device --rounds --skip-e2e --json; }

phase_bench_deeptte() { "$PY" "$TASKS" deeptte --batch 256 --json "$OUT/results/bench_deeptte.json"; }
check_bench_deeptte() { has_flags "$TASKS" deeptte && "$PY" "$TASKS" deeptte --help | grep -q -- --batch; }

phase_bench_streams() { "$PY" "$TASKS" streams --json "$OUT/results/bench_streams.json"; }
check_bench_streams() {
  [ -f benchmarks/components.py ] && "$PY" "$TASKS" streams --help | grep -q -- --shape
}

phase_summary() { "$PY" "$TASKS" summary "$OUT"; }
check_summary() { "$PY" "$TASKS" summary --help > /dev/null; }
export -f $(compgen -A function | grep -E '^(phase|check)_')
for p in "${PHASES[@]}"; do
  declare -F "phase_${p%%:*}" > /dev/null || { echo "gpu_check: unknown phase '${p%%:*}'"; exit 1; }
done
if [ $DRY -eq 1 ]; then
  # the GPU machine has no gymnasium: here an import of it fails, so a check that imports it fails
  mkdir -p "$OUT/.no_gymnasium/gymnasium"
  echo 'raise ImportError("gymnasium is absent on the GPU machine (gpu_check.sh --dry-run)")' \
    > "$OUT/.no_gymnasium/gymnasium/__init__.py"
  export PYTHONPATH="$OUT/.no_gymnasium${PYTHONPATH:+:$PYTHONPATH}"
fi

# ---- driver
LOG="$OUT/gpu_check.log"
: > "$LOG"
start=$(date +%s)
plan=$(IFS=,; echo "${PHASES[*]}")
sum=0
for p in "${PHASES[@]}"; do sum=$(( sum + ${p#*:} )); done
dry_flag=(); [ $DRY -eq 1 ] && dry_flag=(--dry-run)
"$PY" "$TASKS" record "$OUT" --plan "$plan" --total-budget "$TOTAL_BUDGET" "${dry_flag[@]}" \
  || { echo "gpu_check: cannot write $OUT/gpu_report.json" | tee -a "$LOG"; exit 1; }
echo "gpu_check: $(date -u +%FT%TZ), phases ${PHASES[*]}, budgets sum ${sum}s of ${TOTAL_BUDGET}s" | tee -a "$LOG"
failed=0
if [ $sum -gt $TOTAL_BUDGET ]; then
  echo "gpu_check: the phase budgets sum to ${sum}s > ${TOTAL_BUDGET}s" | tee -a "$LOG"; failed=1
fi

for p in "${PHASES[@]}"; do
  name=${p%%:*}; budget=${p#*:}
  plog="$OUT/logs/$name.log"
  t0=$(date +%s)
  if [ $DRY -eq 1 ]; then
    "check_$name" > "$plog" 2>&1
    rc=$?
    status=$([ $rc -eq 0 ] && echo planned || echo failed)
    "$PY" "$TASKS" record "$OUT" --phase "$name" --rc $rc --status "$status" --budget "$budget" \
      --seconds $(( $(date +%s) - t0 )) --log "logs/$name.log" --command "$(declare -f "phase_$name" | sed '1,2d;$d' | head -c 800)"
    echo "[dry-run] $name (${budget}s): $status$([ $rc -ne 0 ] && echo ": $(tail -3 "$plog")")" | tee -a "$LOG"
    [ $rc -eq 0 ] || failed=1
    continue
  fi
  left=$(( TOTAL_BUDGET - (t0 - start) ))
  limit=$(( budget < left ? budget : left ))
  if [ $limit -le 0 ]; then
    "$PY" "$TASKS" record "$OUT" --phase "$name" --rc -1 --status skipped --note "no time left of ${TOTAL_BUDGET}s" \
      --elapsed $(( t0 - start ))
    echo "[$(( t0 - start ))s] $name: skipped (no time left)" | tee -a "$LOG"
    continue
  fi
  echo "[$(( t0 - start ))s] $name: start (limit ${limit}s)" | tee -a "$LOG"
  timeout -k 5 "$limit" bash -c "phase_$name" > "$plog" 2>&1
  rc=$?
  secs=$(( $(date +%s) - t0 ))
  extra=()
  [ -f "$OUT/junit/$name.xml" ] && extra+=(--junit "$OUT/junit/$name.xml")
  [ -f "$OUT/results/$name.json" ] && extra+=(--result "$OUT/results/$name.json")
  [ "$name" = env ] && extra+=(--result "$OUT/results/env.json")
  [ "$name" = probes ] && extra+=(--result "$OUT/results/probes.json")
  note=""
  [ $rc -eq 77 ] && note="$(tail -1 "$plog")"
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && note="timeout after ${limit}s"
  "$PY" "$TASKS" record "$OUT" --phase "$name" --rc $rc --seconds $secs --budget "$budget" \
    --log "logs/$name.log" --elapsed $(( $(date +%s) - start )) ${note:+--note "$note"} "${extra[@]}"
  case $rc in 0) st=ok ;; 77) st="skipped: $note" ;; 124|137) st="TIMEOUT (${limit}s)"; failed=1 ;; *) st="FAILED rc $rc"; failed=1 ;; esac
  echo "[$(( $(date +%s) - start ))s] $name: $st in ${secs}s" | tee -a "$LOG"
  [ "$st" = ok ] || tail -5 "$plog" | sed 's/^/    /' >> "$LOG"
  # without a CUDA build nothing after it can run: record the rest as skipped
  if [ "$name" = build ] && [ $rc -ne 0 ]; then
    for q in "${PHASES[@]}"; do
      n=${q%%:*}
      case "$n" in env|build|summary) continue ;; esac
      "$PY" "$TASKS" record "$OUT" --phase "$n" --rc -1 --status skipped --note "the build failed"
    done
    "$PY" "$TASKS" summary "$OUT" >> "$LOG" 2>&1
    break
  fi
done
echo "gpu_check: done in $(( $(date +%s) - start ))s; report $OUT/gpu_report.json" | tee -a "$LOG"
exit $failed
