#!/usr/bin/env bash
# Chapter 10's GPU checks in one command, for a machine with a CUDA GPU, torch, numba and numba-cuda:
#
#     COMMIT=abc1234 OUT=/path/to/results scripts/gpu_check.sh     (default OUT: out/gpu_check; about 8 minutes)
#
# In order of importance, so that a run cut short still leaves the headline results:
#   env         the machine and the code: versions, nvidia-smi, the commit (COMMIT=..., else git's) and a
#               hash of minipaged/'s sources (`python -m minipaged.lab.kernels.gpu_inputs hash --commit C`
#               recomputes it where git is)
#   bench_quick the benchmark's short grid, including the target shape (SmolLM2, batch 64, ctx 2048)
#   check       every kernel against the reference on the GPU (bench_kernels --check, no pytest needed)
#   ceilings    torch's device copy; numba reading fp16 as 2-, 4- and 8-byte words; a numba paged read
#               with no math at each shape the benchmark times (quick shapes first)
#   e2e         the engine generates the same greedy tokens with the numba kernels and the reference
#   ncu         Nsight Compute on the kernels at the target shape (only where `ncu` is installed)
#   ptx         the kernels compiled for this GPU's compute capability
#   pytest      tests/ch10_paged_attention_kernel on the GPU (if pytest is installed)
#   bench       the full benchmark grid (its JSON is rewritten after each shape, so a cut run keeps rows)
#   assemble    the record, gpu_check.json, from all of the above (python -m minipaged.lab.kernels.gpu_record)
# The run stays within BUDGET_S seconds (default 480); a step that would start too late is skipped and
# says so. It leaves at most 5 files in $OUT: summary.txt (one line a step), gpu_check.log (every step's
# output), gpu_check.json (the record), ncu.txt (the profile) and raw.tar.gz (each step's JSON:
# `python -m minipaged.lab.kernels.gpu_record assemble OUT` reads it again).
#
# MINIPAGED_ALLOW_UNTESTED_KERNELS=1 lets kernel="auto" pick v3, which has never run on a GPU (auto
# otherwise picks only v1 and v2, the kernels measured on one): so the run measures v3 as the
# backend's choice too, in the benchmark's "auto" column, the check and the engine end to end.
#
# The image's numba-cuda expects numpy.row_stack, which its numpy no longer has: scripts/gpu_shim goes
# first on PYTHONPATH, and its sitecustomize.py puts the function back.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-out/gpu_check}"
BUDGET_S="${BUDGET_S:-480}"
COMMIT="${COMMIT:-}"
PY="${PYTHON:-$(command -v python3 || command -v python)}"
unset NUMBA_ENABLE_CUDASIM
export MINIPAGED_ALLOW_UNTESTED_KERNELS=1
export PYTHONPATH="$PWD/scripts/gpu_shim:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
RAW="$OUT/raw"
rm -rf "$RAW" "$OUT/raw.tar.gz" "$OUT/ncu.txt" "$OUT/gpu_check.json"
mkdir -p "$RAW"
START=$(date +%s)
FAILED=0
: > "$OUT/summary.txt"
: > "$OUT/gpu_check.log"

say() { echo "$*" | tee -a "$OUT/summary.txt"; }

# step NAME LIMIT_S MIN_S COMMAND...: run with a time limit, never past the budget; output to the log
step() {
    local name=$1 limit=$2 min=$3; shift 3
    local left=$(( BUDGET_S - ($(date +%s) - START) ))
    if (( left < min )); then say "SKIP $name: ${left}s left of the ${BUDGET_S}s budget"; return; fi
    (( limit > left )) && limit=$left
    local t0=$(date +%s)
    echo "==> $name: $*" >> "$OUT/gpu_check.log"
    timeout "$limit" "$@" >> "$OUT/gpu_check.log" 2>&1
    local rc=$?
    local verdict=ok
    (( rc == 124 )) && verdict="TIMEOUT after ${limit}s"
    (( rc != 0 && rc != 124 )) && verdict="FAILED (rc=$rc)"
    [[ $verdict == ok ]] || FAILED=1
    say "$(printf '%-12s %-22s %4ss  %s' "$name" "$verdict" "$(( $(date +%s) - t0 ))" "$*")"
}

say "gpu_check $(date -u +%FT%TZ), budget ${BUDGET_S}s, python $PY, commit ${COMMIT:-from git}"
step env 60 5 bash -c "nvidia-smi; \"$PY\" -m minipaged.lab.kernels.gpu_inputs env ${COMMIT:+--commit $COMMIT} \
    --out \"$RAW/env.json\" && \"$PY\" -c 'import numba.cuda as c; c.detect()'"
step bench_quick 150 60 "$PY" -m minipaged.lab.bench.kernels --quick --json --out "$RAW/bench_quick.json"
step check 120 40 "$PY" -m minipaged.lab.bench.kernels --check --out "$RAW/check.json"
step ceilings 120 40 "$PY" -m minipaged.lab.kernels.ceilings --out "$RAW/ceilings.json" --budget-s 80
step e2e 90 40 "$PY" scripts/gpu_e2e.py --out "$RAW/e2e.json"
if command -v ncu >/dev/null; then
    # the kernels inside profile_target's NVTX range; if that range is not seen, the kernels by name
    SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
        --section WarpStateStats --section SchedulerStats --clock-control none --launch-count 12"
    PROFILE="\"$PY\" -m minipaged.lab.kernels.profile_target --bench \"$RAW/bench_quick.json\""
    step ncu 150 60 bash -c "ncu --nvtx --nvtx-include 'profile/' $SECTIONS $PROFILE > \"$OUT/ncu.txt\"; \
        grep -q 'Section:' \"$OUT/ncu.txt\" || ncu --kernel-name regex:'paged|merge|attention' $SECTIONS \
        $PROFILE > \"$OUT/ncu.txt\""
else
    say "SKIP ncu: Nsight Compute (ncu) is not installed here"
fi
CC=$("$PY" -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())' 2>/dev/null || echo 9.0)
step ptx 60 20 "$PY" -m minipaged.lab.kernels.ptx --cc "$CC" --json
if "$PY" -c 'import pytest' 2>/dev/null; then
    step pytest 180 60 "$PY" -m pytest tests/ch10_paged_attention_kernel -ra -q -p no:cacheprovider
else
    say "SKIP pytest: not installed here (the check step ran the same GPU comparisons)"
fi
step bench 300 60 "$PY" -m minipaged.lab.bench.kernels --out "$RAW/bench.json"

# the record, whatever the budget says: it is what the run is for
BUDGET_S=$(( $(date +%s) - START + 60 )) step assemble 60 0 "$PY" -m minipaged.lab.kernels.gpu_record assemble \
    "$OUT" --out "$OUT/gpu_check.json" ${COMMIT:+--commit "$COMMIT"}
tar czf "$OUT/raw.tar.gz" -C "$OUT" raw && rm -rf "$RAW"

say "done in $(( $(date +%s) - START ))s; $( ((FAILED)) && echo 'SOME STEPS FAILED' || echo 'all steps ok')"
exit "$FAILED"
