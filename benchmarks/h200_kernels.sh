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
# configs/kernels-launch.yaml times launch-setting variants); SWEEP_S: seconds for each.
# MIXERS: only these mixers of the sweeps (comma-separated; empty: all).
# TESTS / TESTS_S: GPU test files run first, and their limit (0: none; the default).
# AB_S (0: off): first, for AB_S seconds at most, the before/after timing of the Triton kernels
# of tree AB_BEFORE (default .abtree, an exported kernels/ with a COMMIT file) against this one's,
# through the public ops (benchmarks/ab_public_ops.py): both trees' first calls (cold compile) in
# parallel, then AB_ROUNDS rounds of before, after; lines in $OUT/ab_public_ops.jsonl, medians
# and ratios in $OUT/ab_summary.json.
# COLD_S (0: off): first, benchmarks/cold_compile.py (each op's training-step kernels from an
# empty Triton cache, per head dim, COLD_JOBS processes at once) into $OUT/cold_compile_h200.json.
# FA4: with .fa4b carried (benchmarks/fa4_carry.sh), FlashAttention-4 is installed first.
# FLA_WARM_S (0: off): first compile FLA's autotuned chunk_gla kernels in FLA_WARM_PROCS
# parallel processes (benchmarks/fla_warm_compile.py) into the Triton cache .triton_cache/,
# which a warm machine keeps between calls, so the sweep's FLA columns find them compiled.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/h200_kernels_out}
source benchmarks/device_preamble.sh
mkdir -p .triton_cache "$OUT/results"
export TRITON_CACHE_DIR="$PWD/.triton_cache" TRITON_CACHE_AUTOTUNING=1
# earlier records carried in (results/runs/kernels) count as done
[ -d results/runs/kernels ] && mkdir -p "$OUT/results/runs" && cp -r results/runs/kernels "$OUT/results/runs/"

if [ "${COLD_S:-0}" -gt 0 ]; then
    timeout -s INT "$COLD_S" python3 benchmarks/cold_compile.py --out "$OUT/cold_compile_h200.json" \
        --jobs "${COLD_JOBS:-6}" 2>&1 | tail -n 14
fi
if [ -d .fa4b ]; then source benchmarks/fa4_carry.sh install >"$OUT/fa4.log" 2>&1; tail -n 3 "$OUT/fa4.log"; fi
if [ "${AB_S:-0}" -gt 0 ]; then
    ab_end=$(( $(date +%s) + AB_S ))
    F=$OUT/ab_public_ops.jsonl
    ab() { local left=$(( ab_end - $(date +%s) )); [ "$left" -gt 0 ] || return 1
           timeout -s INT "$left" python3 benchmarks/ab_public_ops.py --out "$F" "$@"; }
    ab --tree "${AB_BEFORE:-.abtree}" --label before --warm-only >"$OUT/ab_warm_before.log" 2>&1 &
    ab --tree . --label after --warm-only >"$OUT/ab_warm_after.log" 2>&1 &
    wait
    for r in $(seq 1 "${AB_ROUNDS:-3}"); do
        ab --tree "${AB_BEFORE:-.abtree}" --label before --round "$r" >/dev/null 2>>"$OUT/ab_err.log"
        ab --tree . --label after --round "$r" >/dev/null 2>>"$OUT/ab_err.log"
    done
    python3 benchmarks/ab_public_ops.py --out "$F" --summarize before after >"$OUT/ab_summary.json"
    grep -E '"(op|T|phase|ratio)"' "$OUT/ab_summary.json" | paste - - - - | head -n 30
fi
if [ "${TESTS_S:-0}" -gt 0 ]; then
    # shellcheck disable=SC2086
    timeout -s INT "${TESTS_S}" python3 -m pytest -q -s -p no:cacheprovider ${TESTS:-tests/gpu} 2>&1 \
        | grep -E "GPU-ERR|passed|failed|Error|PASSED|FAILED" | tee "$OUT/gpu_tests.log"
fi
if [ "${FLA_WARM_S:-0}" -gt 0 ]; then
    timeout -s INT "${FLA_WARM_S}" python3 benchmarks/fla_warm_compile.py --op gla_vector \
        --procs "${FLA_WARM_PROCS:-14}" 2>&1 | grep -v "^\s*$" | tail -n 20 | tee "$OUT/fla_warm.log"
fi
for sweep in ${SWEEPS:-configs/kernels-gpu.yaml}; do
    timeout -s INT "${SWEEP_S:-500}" python3 -m harness sweep "$sweep" --results "$OUT/results" --no-wandb \
        ${MIXERS:+--mixer "$MIXERS"} 2>&1 | tail -n 40 | tee "$OUT/$(basename "$sweep" .yaml).log"
done
ls -laR "$OUT/results/runs" 2>/dev/null | tail -n 30
# A call brings back at most 8 files: the records and the logs go back as one archive each.
tar czf "$OUT/results.tgz" -C "$OUT" results && rm -rf "$OUT/results"
logs=$(cd "$OUT" && ls ./*.log ./*.jsonl 2>/dev/null)
[ -n "$logs" ] && tar czf "$OUT/logs.tgz" -C "$OUT" $logs && (cd "$OUT" && rm -f $logs)
ls -la "$OUT"
