#!/usr/bin/env bash
# Kernel timings on one H200 in one device call, as ordinary run records of the kernels task
# (tasks/kernels.py, the one timer of tasks/common/timing.py): the sweep files below, each
# under its own time limit. A sweep resumes from the records it finds, so a cut call loses
# only the run in flight; the records come back in $OUT/results.tgz (results/runs/kernels/;
# copy them into results/ for harness compare, the leaderboard and the dashboard), the logs
# and the A/B lines in $OUT/logs.tgz.
#
#   bash benchmarks/h200_kernels.sh            # with carry=[".whl"]
#
# SWEEPS: sweep files, space-separated (default configs/kernels-gpu.yaml, every op beside FLA;
# configs/kernels-launch.yaml times launch-setting variants; "none": no sweep); SWEEP_S:
# seconds for each.
# MIXERS: only these mixers of the sweeps (comma-separated; empty: all; each sweep takes those it
# runs, and one that runs none is skipped). FRESH=1: the committed
# records do not count as done (time again after a kernel change).
# TESTS / TESTS_S: GPU test files and their limit (0: none; the default); TESTS_K: a pytest -k
# expression among them; TESTS_N: pytest-xdist workers, at most one per TESTS_GIB_PER_WORKER
# (default 12) GiB of the GPU's memory (its wheel carried in .whl/; they compile
# in parallel on the device's cores and share the GPU's memory, each test releasing its cache);
# TESTS_ARGS: more pytest arguments (e.g. -x); the tests of one case share a worker
# (tests/gpu/conftest.py, --dist loadgroup); they run before the sweeps, or after them with
# TESTS_LAST=1.
# AB_S (0: off): first, for AB_S seconds at most, the before/after timing of the Triton kernels
# of tree AB_BEFORE (default .abtree, an exported kernels/ with a COMMIT file) against this one's,
# through the public ops (benchmarks/ab_public_ops.py): both trees' first calls (cold compile) in
# parallel, then AB_ROUNDS rounds of before, after; lines in $OUT/ab_public_ops.jsonl, medians
# and ratios in $OUT/ab_summary.json.
# COLD_S (0: off): first, benchmarks/cold_compile.py (each op's training-step kernels from an
# empty Triton cache, per head dim, COLD_JOBS processes at once, under the image's Triton: it
# runs before a carried one is installed) into $OUT/cold_compile_gpu.json (the device named in it).
# FA4: with .fa4b carried (benchmarks/fa4_carry.sh), FlashAttention-4 is installed first.
# Triton: with .triton carried (benchmarks/triton_carry.sh), that Triton runs instead of the image's
# (FLA's gated backward needs >= 3.7.1 on Hopper).
# FLA_WARM_S (0: off): first compile FLA's autotuned kernels of FLA_WARM_OPS (space-separated
# fla_warm_compile.py --op names; default gla_vector) at FLA_WARM_HEADS (default 16x128; e.g.
# 16x128,32x64) in FLA_WARM_PROCS parallel processes (benchmarks/fla_warm_compile.py; at most one per
# 12 GiB of GPU memory: 14 and 9 ran an H100 out of memory) into the
# Triton cache .triton_cache/ (git-ignored, so a warm machine keeps it between calls), where
# the sweeps' FLA columns find them compiled.
# CALL_S (default 570): the whole script's seconds. Every step's limit is cut to what is left
# of them, and the records and logs are packed after every step, so a call that the device
# tool stops at its own limit still brings back what finished.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/h200_kernels_out}
call_end=$(( $(date +%s) + ${CALL_S:-570} ))
source benchmarks/device_preamble.sh
mkdir -p .triton_cache "$OUT/results" "$OUT/logs"
export TRITON_CACHE_DIR="$PWD/.triton_cache" TRITON_CACHE_AUTOTUNING=1
export GPU_ERRORS_JSON="$OUT/gpu_errors.json"
# earlier records carried in (results/runs/kernels) count as done, so a cut sweep resumes; a
# record is matched by its config, not its commit: FRESH=1 times again what the tree has
# changed (the committed records are not carried in); with SWEEPS=none nothing is carried in
if [ "${FRESH:-0}" = 0 ] && [ "${SWEEPS:-}" != none ] && [ -d results/runs/kernels ]; then
    mkdir -p "$OUT/results/runs" && cp -r results/runs/kernels "$OUT/results/runs/"
fi

# seconds a step may take: its own limit $1, cut to the call's remaining time less 10 s to pack
limit() { local left=$(( call_end - $(date +%s) - 10 )); [ "$left" -lt "$1" ] && echo $(( left > 0 ? left : 1 )) || echo "$1"; }
# A call brings back at most 8 files: the records and the logs go back as one archive each,
# rewritten after every step.
pack() {
    tar czf "$OUT/results.tgz.part" -C "$OUT" results && mv "$OUT/results.tgz.part" "$OUT/results.tgz"
    tar czf "$OUT/logs.tgz.part" -C "$OUT" logs && mv "$OUT/logs.tgz.part" "$OUT/logs.tgz"
}

if [ "${COLD_S:-0}" -gt 0 ]; then
    timeout -k 20 -s INT "$(limit "$COLD_S")" python3 benchmarks/cold_compile.py --out "$OUT/cold_compile_gpu.json" \
        --jobs "${COLD_JOBS:-6}" 2>&1 | tail -n 14
    pack
fi
if [ -d .fa4b ]; then source benchmarks/fa4_carry.sh install >"$OUT/logs/fa4.log" 2>&1; tail -n 3 "$OUT/logs/fa4.log"; fi
if [ -d .triton ]; then source benchmarks/triton_carry.sh install || exit 1; fi
if [ "${AB_S:-0}" -gt 0 ]; then
    ab_end=$(( $(date +%s) + $(limit "$AB_S") ))
    F=$OUT/logs/ab_public_ops.jsonl
    ab() { local left=$(( ab_end - $(date +%s) )); [ "$left" -gt 0 ] || return 1
           timeout -s INT "$left" python3 benchmarks/ab_public_ops.py --out "$F" "$@"; }
    ab --tree "${AB_BEFORE:-.abtree}" --label before --warm-only >"$OUT/logs/ab_warm_before.log" 2>&1 &
    ab --tree . --label after --warm-only >"$OUT/logs/ab_warm_after.log" 2>&1 &
    wait
    for r in $(seq 1 "${AB_ROUNDS:-3}"); do
        ab --tree "${AB_BEFORE:-.abtree}" --label before --round "$r" >/dev/null 2>>"$OUT/logs/ab_err.log"
        ab --tree . --label after --round "$r" >/dev/null 2>>"$OUT/logs/ab_err.log"
    done
    python3 benchmarks/ab_public_ops.py --out "$F" --summarize before after >"$OUT/ab_summary.json"
    grep -E '"(op|T|phase|ratio)"' "$OUT/ab_summary.json" | paste - - - - | head -n 30
    pack
fi
gpu_tests() {
    # The whole output goes into the logs (each case's errors included, and with -rA a line for
    # every test that finished, so a run cut at its limit says which ran); the summary lines here.
    # Workers are capped at one per TESTS_GIB_PER_WORKER (default 12) GiB of GPU memory: a worker
    # holds up to about 8 GiB at once (12 of them filled an H100's 79 GiB on 2026-12-07, and 87
    # tests failed out of memory), so an H100 takes 6 and an H200 11.
    local workers=${TESTS_N:-} gib cap
    if [ -n "$workers" ]; then
        gib=$(( $(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1) / 1024 ))
        cap=$(( gib / ${TESTS_GIB_PER_WORKER:-12} )); [ "$cap" -ge 1 ] || cap=1
        if [ "$workers" -gt "$cap" ]; then
            echo "TESTS_N=$workers cut to $cap workers: $gib GiB of GPU memory at ${TESTS_GIB_PER_WORKER:-12} GiB a worker"
            workers=$cap
        fi
    fi
    # shellcheck disable=SC2086
    timeout -k 20 -s INT "$(limit "$TESTS_S")" python3 -m pytest -q -rA -s -p no:cacheprovider ${TESTS:-tests/gpu} \
        ${TESTS_K:+-k "$TESTS_K"} ${workers:+-n "$workers" --dist loadgroup} ${TESTS_ARGS:-} >"$OUT/logs/gpu_tests.log" 2>&1
    grep -E "GPU-ERR|passed|failed|skipped|PASSED|FAILED|^E  " "$OUT/logs/gpu_tests.log" | tail -n 40
    pack
}
[ "${TESTS_S:-0}" -gt 0 ] && [ "${TESTS_LAST:-0}" = 0 ] && gpu_tests
if [ "${FLA_WARM_S:-0}" -gt 0 ]; then
    warm_end=$(( $(date +%s) + $(limit "$FLA_WARM_S") ))
    for op in ${FLA_WARM_OPS:-gla_vector}; do
        left=$(( warm_end - $(date +%s) )); [ "$left" -gt 0 ] || break
        timeout -k 20 -s INT "$left" python3 benchmarks/fla_warm_compile.py --op "$op" \
            --heads "${FLA_WARM_HEADS:-16x128}" --procs "${FLA_WARM_PROCS:-14}" >>"$OUT/logs/fla_warm.log" 2>&1
    done
    grep -v "^\s*$" "$OUT/logs/fla_warm.log" | tail -n 10
    pack
fi
# MIXERS among one sweep's own mixers (the sweep refuses a mixer it does not run, and one
# MIXERS list serves several sweeps); a sweep that runs none of them is skipped, and says so
sweep_mixers() {
    python3 - "$1" "$MIXERS" <<'PY'
import sys
from pathlib import Path
from harness.sweep import expand, load_sweep
held = {point.mixer for point in expand(load_sweep(Path(sys.argv[1])), "cuda").points}
print(",".join(m for m in sys.argv[2].split(",") if m in held))
PY
}
for sweep in ${SWEEPS:-configs/kernels-gpu.yaml}; do
    [ "$sweep" = none ] && continue
    log="$OUT/logs/$(basename "$sweep" .yaml).log"
    mixers=${MIXERS:+$(sweep_mixers "$sweep")}
    if [ -n "${MIXERS:-}" ] && [ -z "$mixers" ]; then
        echo "$sweep: none of MIXERS=$MIXERS in it, skipped" | tee "$log"
        continue
    fi
    timeout -k 20 -s INT "$(limit "${SWEEP_S:-500}")" python3 -m harness sweep "$sweep" --results "$OUT/results" \
        --no-wandb ${mixers:+--mixer "$mixers"} >"$log" 2>&1
    grep -E "✓|✗|error|runs? on" "$log" | tail -n 20
    pack
done
[ "${TESTS_S:-0}" -gt 0 ] && [ "${TESTS_LAST:-0}" != 0 ] && gpu_tests
pack
rm -rf "$OUT/results" "$OUT/logs" "$GPU_ERRORS_JSON.lock"
ls -la "$OUT"
