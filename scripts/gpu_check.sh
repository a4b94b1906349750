#!/usr/bin/env bash
# Chapter 10's GPU checks in one command, for a machine with a CUDA GPU, torch, numba and numba-cuda:
#
#     OUT=/path/to/results scripts/gpu_check.sh        (default OUT: out/gpu_check; about 8 minutes)
#
# In order of importance, so that a run cut short still leaves the headline results:
#   env         nvidia-smi, versions, the device numba sees
#   bench_quick the benchmark's short grid, including the target shape (SmolLM2, batch 64, ctx 2048)
#   check       every kernel against the reference on the GPU (bench_kernels --check, no pytest needed)
#   ptx         the kernels compiled for this GPU's compute capability
#   e2e         the engine generates the same greedy tokens with the numba kernels and the reference
#   pytest      tests/ch10_paged_attention_kernel on the GPU (if pytest is installed)
#   bench       the full benchmark grid (its JSON is rewritten after each shape, so a cut run keeps rows)
# Everything lands in $OUT: one .log per step, JSON results, summary.txt. The whole run stays within
# BUDGET_S seconds (default 450); a step that would start too late is skipped and says so.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-out/gpu_check}"
BUDGET_S="${BUDGET_S:-450}"
PY="${PYTHON:-$(command -v python3 || command -v python)}"
unset NUMBA_ENABLE_CUDASIM
mkdir -p "$OUT"
START=$(date +%s)
FAILED=0
: > "$OUT/summary.txt"

say() { echo "$*" | tee -a "$OUT/summary.txt"; }

# step NAME LIMIT_S MIN_S COMMAND...: run with a time limit, never past the budget
step() {
    local name=$1 limit=$2 min=$3; shift 3
    local left=$(( BUDGET_S - ($(date +%s) - START) ))
    if (( left < min )); then say "SKIP $name: ${left}s left of the ${BUDGET_S}s budget"; return; fi
    (( limit > left )) && limit=$left
    local t0=$(date +%s)
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    local verdict=ok
    (( rc == 124 )) && verdict="TIMEOUT after ${limit}s"
    (( rc != 0 && rc != 124 )) && verdict="FAILED (rc=$rc)"
    [[ $verdict == ok ]] || FAILED=1
    say "$(printf '%-12s %-22s %4ss  %s' "$name" "$verdict" "$(( $(date +%s) - t0 ))" "$*")"
}

say "gpu_check $(date -u +%FT%TZ), budget ${BUDGET_S}s, python $PY"
step env 30 5 bash -c "git log -1 --oneline 2>/dev/null; nvidia-smi; $PY -c 'import torch, numba, numba.cuda as c; \
print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, torch.cuda.get_device_name()); \
print(\"numba\", numba.__version__, \"simulator\", numba.config.ENABLE_CUDASIM); c.detect()'; \
$PY -m pip list 2>/dev/null | grep -i -E 'numba|cuda|torch|pytest'"
step bench_quick 150 60 "$PY" -m minipaged.attention.bench_kernels --quick --json --out "$OUT/bench_quick.json"
step check 120 40 "$PY" -m minipaged.attention.bench_kernels --check --out "$OUT/check.json"
CC=$("$PY" -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())' 2>/dev/null || echo 9.0)
step ptx 90 30 "$PY" -m minipaged.attention.kernels.ptx --cc "$CC" --json
step e2e 90 40 "$PY" scripts/gpu_e2e.py --out "$OUT/e2e.json"
if "$PY" -c 'import pytest' 2>/dev/null; then
    step pytest 180 60 "$PY" -m pytest tests/ch10_paged_attention_kernel -ra -q -p no:cacheprovider \
        --junitxml="$OUT/ch10_junit.xml"
else
    say "SKIP pytest: not installed here (the check step ran the same GPU comparisons)"
fi
step bench 400 60 "$PY" -m minipaged.attention.bench_kernels --out "$OUT/bench.json"

say "done in $(( $(date +%s) - START ))s; $( ((FAILED)) && echo 'SOME STEPS FAILED' || echo 'all steps ok')"
exit "$FAILED"
