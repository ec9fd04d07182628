#!/usr/bin/env bash
# GPU check (issue 24, issue 38): the one command a GPU machine runs. One H200 (sm_90), 16 cores, python3 3.12
# with torch + CUDA preinstalled, no network, no gymnasium, no install of stfast: the build is in place
# (setup.py build_ext --inplace) and every phase imports stfast from this checkout (PYTHONPATH = its root).
# Phases, each with its own time budget (a timeout), in this order: build (sm_90 only, all cores) -> CUDA
# correctness tests (geo-conv, LSTM, communicator, component streams) -> probes of issue 24 rows 1-4 ->
# compute-sanitizer memcheck (caching allocator off; float32, then float16), racecheck, synccheck and
# initcheck -> CUDA benchmarks (CUDA events) ->
# summary. The budgets sum to <= 540 s (9 minutes, build included), and no phase runs past the 540 s
# deadline counted from the start. After every phase: OUTDIR/gpu_report.json and OUTDIR/gpu_check.log are
# rewritten, and OUTDIR/gpu_check.tar.gz (every file of the run) and OUTDIR/summary.json are repacked, so
# a timeout or a kill loses nothing earlier; each phase's output is in OUTDIR/logs/<phase>.log, its tests'
# outcomes in OUTDIR/results/<phase>.tests.jsonl as they complete (and OUTDIR/junit/<phase>.xml at its end).
#
#   bash benchmarks/gpu_check.sh OUTDIR             the run
#   bash benchmarks/gpu_check.sh --dry-run OUTDIR   on a CPU machine / CI: checks that every phase's command
#                                                   exists and accepts its flags and that the budgets sum to
#                                                   <= 540 s; writes the plan to OUTDIR/gpu_report.json
#
# Exit status: 0 when every phase passed or was skipped with a note, 1 otherwise. Only the sanitizer
# phases may be skipped (exit 77 of the phase), and only when compute-sanitizer refused to start the target
# (it exited non-zero and the target never touched its --started file). Any other non-zero exit fails its
# phase: 3 = the sanitizer found errors, 4 = a Python entry point found no GPU or a CPU-only build
# (benchmarks/_device.py), 5 = compute-sanitizer not found (looked for in $COMPUTE_SANITIZER, PATH,
# $CUDA_HOME/bin, beside nvcc, /usr/local/cuda/bin; the target still ran without it), 124/137 = its
# timeout, else an import error, a failed test, a CUDA error. Python: $PYTHON (default python3).
#
# Test selections: tests_geo_conv runs the CUDA tests of tests/test_geo_conv.py except the probes
# (PROBE_K: input validation and degenerate sizes, rows 1-4, which the probes phase runs), tests_lstm every
# CUDA test of tests/test_lstm.py (invalid and degenerate inputs included). opcheck and torch.compile run
# on the CPU in CI (the fake kernels and tracing are the same on every device); here two opchecks per op
# (float32 forward of one case, backward on transposed inputs), which compare the CUDA kernels' outputs
# with the fake kernels'.
set -uo pipefail

DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; shift; fi
OUT="${1:?usage: gpu_check.sh [--dry-run] OUTDIR}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
# no install of stfast on the GPU machine: the in-place build of this checkout is what every phase imports
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python3}"
TASKS=benchmarks/gpu_check_tasks.py
TOTAL_BUDGET=${GPU_CHECK_TOTAL_BUDGET:-540}  # the override is for the tests' rehearsals on slow CPUs
PROBE_WORDS="invalid or reject or degenerate or padded_lengths or short_trip or miss_points"
PROBE_K="cuda and ($PROBE_WORDS)"
# the CUDA opchecks kept: float32 (dtype0) of one case, and the backward on transposed inputs
GEO_K="(cuda and not ($PROBE_WORDS or opcheck or compile)) or (opcheck and cuda and (transposed or (mixed and dtype0)))"
LSTM_K="(cuda and not (opcheck or compile)) or (opcheck and cuda and (transposed or dtype0))"
export PY OUT TASKS PROBE_K GEO_K LSTM_K
mkdir -p "$OUT/logs" "$OUT/junit" "$OUT/results"

# name:budget_s, in the order they run ($GPU_CHECK_PHASES, the same format, overrides: the tests use it).
# Their sum must not exceed 540 s (the dry run fails otherwise).
# env: the first `import torch` of a cold machine takes seconds; the sanitizers start torch under them.
PHASES=(env:10 build:190 tests_geo_conv:30 tests_lstm:35 tests_comm:20 tests_components:20 probes:25
        memcheck:45 memcheck_half:25 racecheck:35 synccheck:20 initcheck:20 bench_geo_conv:15 bench_lstm:20
        bench_deeptte:10 bench_streams:10 summary:5)
if [ -n "${GPU_CHECK_PHASES:-}" ]; then read -ra PHASES <<< "$GPU_CHECK_PHASES"; fi

pytest_phase() {  # name, then pytest arguments; each test's outcome streamed to results/<name>.tests.jsonl
  local name=$1; shift
  STFAST_TEST_RESULTS_JSONL="$OUT/results/$name.tests.jsonl" \
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
# compute-sanitizer: $COMPUTE_SANITIZER, else on PATH, else in $CUDA_HOME/bin, else beside nvcc (its link
# resolved), else /usr/local/cuda/bin. Prints its path; fails when there is none.
find_sanitizer() {
  local nvcc c
  nvcc="$(command -v nvcc 2> /dev/null)"
  for c in "${COMPUTE_SANITIZER:-}" "$(command -v compute-sanitizer 2> /dev/null)" \
           "${CUDA_HOME:+$CUDA_HOME/bin/compute-sanitizer}" \
           "${nvcc:+$(dirname "$(readlink -f "$nvcc")")/compute-sanitizer}" /usr/local/cuda/bin/compute-sanitizer; do
    if [ -n "$c" ] && [ -x "$c" ]; then echo "$c"; return 0; fi
  done
  return 1
}
# compute-sanitizer TOOL on the target subcommand TARGET (target arguments after --). A missing sanitizer
# fails the phase (exit 5, after running the target without it, so its imports and CUDA calls are still
# checked): a GPU run must not pass by skipping. 77 (skipped) only when the sanitizer refused to start it.
sanitize() {
  local tool=$1 target=$2; shift 2
  local opts=() args=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do opts+=("$1"); shift; done
  [ $# -gt 0 ] && shift && args=("$@")
  local started="$OUT/results/$target.started"
  rm -f "$started"
  local cs
  if ! cs="$(find_sanitizer)"; then
    echo "compute-sanitizer not found: the target runs without it"
    "$PY" "$TASKS" "$target" --started "$started" "${args[@]}"
    echo "compute-sanitizer not found (COMPUTE_SANITIZER, PATH, \$CUDA_HOME/bin, beside nvcc," \
         "/usr/local/cuda/bin); the target alone exited $?"
    return 5
  fi
  echo "sanitizer: $cs --tool $tool"
  "$cs" --tool "$tool" --error-exitcode 3 "${opts[@]}" "$PY" "$TASKS" "$target" --started "$started" "${args[@]}"
  local rc=$?
  if [ $rc -ne 0 ] && [ ! -f "$started" ]; then
    echo "compute-sanitizer refused to run the target (rc $rc; it never started)"; return 77
  fi
  return $rc
}
export -f pytest_phase pytest_check has_flags find_sanitizer sanitize

# ---- each phase: phase_<name> runs it (in its own bash, under its timeout), check_<name> dry-runs it
phase_env() { nvidia-smi > "$OUT/logs/nvidia-smi.txt" 2>&1; "$PY" "$TASKS" env --json "$OUT/results/env.json"; }
check_env() { has_flags "$TASKS" record summary pack env probes memcheck-target racecheck-target deeptte streams; }

phase_build() {
  STFAST_CUDA=1 TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS="$(nproc)" "$PY" setup.py build_ext --inplace || return 1
  "$PY" -c "import sys, stfast; i = stfast.build_info(); print(i); sys.exit(0 if i['cuda'] and i['nccl'] else 1)"
}
check_build() { [ -f setup.py ] && [ -f CMakeLists.txt ] && "$PY" -c "import setuptools, torch"; }

phase_tests_geo_conv() { pytest_phase tests_geo_conv tests/test_geo_conv.py -k "$GEO_K"; }
check_tests_geo_conv() { pytest_check tests/test_geo_conv.py -k "$GEO_K"; }

phase_tests_lstm() { pytest_phase tests_lstm tests/test_lstm.py -k "$LSTM_K"; }
check_tests_lstm() { pytest_check tests/test_lstm.py -k "$LSTM_K"; }

# the communicator at world size 1 (NCCL vs torch's NCCL and cupy) and the build report
phase_tests_comm() { pytest_phase tests_comm tests/test_comm.py -k "cuda or nccl or build"; }
check_tests_comm() { pytest_check tests/test_comm.py -k "cuda or nccl or build"; }

# the component executor's CUDA streams plan, fused and reference kernels
phase_tests_components() { pytest_phase tests_components tests/test_components.py -k "cuda_streams"; }
check_tests_components() { pytest_check tests/test_components.py -k "cuda_streams"; }

phase_probes() {
  pytest_phase probes tests/test_geo_conv.py -k "$PROBE_K"
  local rc=$?
  [ $rc -eq 5 ] && echo "no probe tests selected by: $PROBE_K"
  "$PY" "$TASKS" probes --json "$OUT/results/probes.json" || return $?
  [ $rc -eq 0 ] || [ $rc -eq 5 ]
}
check_probes() { pytest_check tests/test_geo_conv.py -k "$PROBE_K" && has_flags "$TASKS" probes; }

# memcheck without the caching allocator (every tensor its own allocation: a read past one is caught)
phase_memcheck() {
  export PYTORCH_NO_CUDA_MEMORY_CACHING=1
  sanitize memcheck memcheck-target --leak-check no --report-api-errors no
}
check_memcheck() {
  has_flags "$TASKS" memcheck-target && "$PY" "$TASKS" memcheck-target --help | grep -q -- --started
}

# the half-precision kernels (their own templates, vector loads) under memcheck
phase_memcheck_half() {
  export PYTORCH_NO_CUDA_MEMORY_CACHING=1
  sanitize memcheck memcheck-target --leak-check no --report-api-errors no -- --dtype float16
}
check_memcheck_half() { "$PY" "$TASKS" memcheck-target --help | grep -q -- --dtype; }

# shared-memory hazards of the geo-conv backward's partial-sum kernels
phase_racecheck() { sanitize racecheck racecheck-target; }
check_racecheck() {
  has_flags "$TASKS" racecheck-target && "$PY" "$TASKS" racecheck-target --help | grep -q -- --started
}

# __syncthreads reached by part of a block, or at different call sites, in every kernel of both ops
phase_synccheck() { sanitize synccheck memcheck-target; }
check_synccheck() { check_memcheck; }

# device memory read before any write (every tensor its own allocation, as under memcheck)
phase_initcheck() {
  export PYTORCH_NO_CUDA_MEMORY_CACHING=1
  sanitize initcheck memcheck-target
}
check_initcheck() { check_memcheck; }

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
check_summary() { "$PY" "$TASKS" summary --help > /dev/null && "$PY" "$TASKS" pack --help > /dev/null; }
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
# every file of OUTDIR into OUTDIR/gpu_check.tar.gz + OUTDIR/summary.json: after each phase, and on the way
# out however the script ends (a kill by the caller's time limit included: bash runs the trap once the
# phase in the foreground has died with its process group)
pack() { "$PY" "$TASKS" pack "$OUT" > /dev/null 2>> "$LOG" || echo "gpu_check: packing $OUT failed" >> "$LOG"; }
trap pack EXIT
trap 'echo "gpu_check: stopped by a signal" >> "$LOG"; exit 143' TERM INT HUP
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
  if [ $limit -le 0 ]; then  # not run: not a pass either
    "$PY" "$TASKS" record "$OUT" --phase "$name" --rc -1 --status pending --note "not run: no time left of ${TOTAL_BUDGET}s" \
      --elapsed $(( t0 - start ))
    echo "[$(( t0 - start ))s] $name: NOT RUN (no time left)" | tee -a "$LOG"
    failed=1
    continue
  fi
  echo "[$(( t0 - start ))s] $name: start (limit ${limit}s)" | tee -a "$LOG"
  timeout -k 5 "$limit" bash -c "phase_$name" > "$plog" 2>&1
  rc=$?
  secs=$(( $(date +%s) - t0 ))
  extra=()
  [ -f "$OUT/junit/$name.xml" ] && extra+=(--junit "$OUT/junit/$name.xml")
  [ -f "$OUT/results/$name.tests.jsonl" ] && extra+=(--tests-jsonl "$OUT/results/$name.tests.jsonl")
  [ -f "$OUT/results/$name.json" ] && extra+=(--result "$OUT/results/$name.json")
  note=""
  status=()  # from the rc (record's default), except a 77 outside the sanitizer phases: a failure
  case "$rc:$name" in
    77:memcheck*|77:racecheck|77:synccheck|77:initcheck) note="$(tail -1 "$plog")" ;;
    5:memcheck*|5:racecheck|5:synccheck|5:initcheck) note="$(tail -1 "$plog")" ;;
    77:*) status=(--status failed); note="exit 77 is a skip of the sanitizer phases only" ;;
    124:*|137:*) note="timeout after ${limit}s" ;;
  esac
  "$PY" "$TASKS" record "$OUT" --phase "$name" --rc $rc --seconds $secs --budget "$budget" "${status[@]}" \
    --log "logs/$name.log" --elapsed $(( $(date +%s) - start )) ${note:+--note "$note"} "${extra[@]}"
  case "$rc:$name" in
    0:*) st=ok ;;
    77:memcheck*|77:racecheck|77:synccheck|77:initcheck) st="skipped: $note" ;;
    124:*|137:*) st="TIMEOUT (${limit}s)"; failed=1 ;;
    4:*) st="FAILED rc 4 (no GPU)"; failed=1 ;;
    *) st="FAILED rc $rc"; failed=1 ;;
  esac
  echo "[$(( $(date +%s) - start ))s] $name: $st in ${secs}s" | tee -a "$LOG"
  [ "$st" = ok ] || tail -5 "$plog" | sed 's/^/    /' >> "$LOG"
  # without a CUDA build nothing after it can run: the rest stay not run
  if [ "$name" = build ] && [ $rc -ne 0 ]; then
    for q in "${PHASES[@]}"; do
      n=${q%%:*}
      case "$n" in env|build|summary) continue ;; esac
      "$PY" "$TASKS" record "$OUT" --phase "$n" --rc -1 --status pending --note "not run: the build failed"
    done
    "$PY" "$TASKS" summary "$OUT" >> "$LOG" 2>&1
    break
  fi
  pack
done
echo "gpu_check: done in $(( $(date +%s) - start ))s; report $OUT/gpu_report.json" | tee -a "$LOG"
exit $failed
