#!/usr/bin/env bash
# Linear attention / GLA on one H200 in one device call: GPU correctness tests, the per-kernel
# breakdown with launch-setting variants (bench_linear_gla.py --variants) and the decode steps, then
# the side-by-side rows with FLA 0.6.0. Each stage has its own time limit and the JSONs are
# rewritten after every measurement, so a cut stage keeps what it measured.
#
#   bash benchmarks/h200_linear_gla_tune.sh      # with carry=[".whl"]; results land in $OUT
#
# Triton's cache (compiled kernels and, with TRITON_CACHE_AUTOTUNING, FLA's autotuning
# results) lives in .triton_cache/ in the repo, which a warm device machine keeps between
# calls. It also goes back as $OUT/triton_cache.tgz.part-aa, -ab, ... (15 MB pieces: a call
# returns files of 16 MB at most); copy them into .triton_cache_parts/ (ignored by git) and
# carry that folder to start a later call, on a fresh machine, with FLA's kernels compiled:
#   carry=[".whl", ".triton_cache_parts"]
# FLA_WARM_S (default 0: off): first compile FLA's autotuned chunk_gla kernels in FLA_WARM_PROCS
# parallel processes into that cache (benchmarks/fla_warm_compile.py), so that the rows'
# same-process FLA autotuning finds them compiled.
# TESTS_S / LIN_GDN_S / TUNE_S / ROWS_S: stage limits (s); TESTS: the GPU test files;
# ROWS_OPS / ROWS_T / ROWS_FLA / TUNE_OPS / TUNE_T: ops and lengths (ROWS_FLA: the ops timed
# with FLA beside ours; empty: ours only).
# VARIANTS: JSON list of ChunkLaunch changes (kernels/common/launch.py).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/h200_linear_gla_out}
source benchmarks/device_preamble.sh
mkdir -p .triton_cache
export TRITON_CACHE_DIR="$PWD/.triton_cache" TRITON_CACHE_AUTOTUNING=1
if ls .triton_cache_parts/triton_cache.tgz.part-* >/dev/null 2>&1; then
    cat .triton_cache_parts/triton_cache.tgz.part-* | tar xzf - && echo "Triton cache restored: $(du -sh .triton_cache | cut -f1)"
fi
# CACHE_BACK=0: the cache stays on the machine (a call returns 8 files at most)
[ "${CACHE_BACK:-1}" = 0 ] || trap 'tar czf - .triton_cache 2>/dev/null | split -b 15m - "$OUT/triton_cache.tgz.part-"; ls -la "$OUT"' EXIT

if [ "${FLA_WARM_S:-0}" -gt 0 ]; then
    timeout -s INT "${FLA_WARM_S}" python3 benchmarks/fla_warm_compile.py --op gla_vector \
        --procs "${FLA_WARM_PROCS:-14}" 2>&1 | grep -v "^\s*$" | tail -n 20 | tee "$OUT/fla_warm.log"
fi
TESTS=${TESTS:-tests/gpu/test_linear_gla_gpu.py tests/gpu/test_step_gpu.py}
if [ "${TESTS_S:-150}" -gt 0 ]; then
    # shellcheck disable=SC2086
    timeout -s INT "${TESTS_S:-150}" python3 -m pytest -q -s -p no:cacheprovider $TESTS 2>&1 \
        | grep -E "GPU-ERR|passed|failed|Error|error|PASSED|FAILED" | tee "$OUT/gpu_tests.log"
fi
if [ "${LIN_GDN_S:-0}" -gt 0 ]; then
    timeout -s INT "${LIN_GDN_S}" python3 benchmarks/bench_lin_gdn.py --out "$OUT/h200_lin_gdn.json" 2>&1 | tail -n 30
fi
VARIANTS=${VARIANTS:-[]}
if [ "${TUNE_S:-150}" -gt 0 ]; then
    timeout -s INT "${TUNE_S:-150}" python3 benchmarks/bench_linear_gla.py --out "$OUT/linear_gla_tune.json" \
        --T --fla-ops --ops ${TUNE_OPS:-linear gla_scalar gla_vector gla_vector_strong} \
        --breakdown-T ${TUNE_T:-32768 2048} --variants "$VARIANTS" 2>&1 | tail -n 80 >"$OUT/tune.log"
fi
if [ "${ROWS_S:-280}" -gt 0 ]; then
    timeout -s INT "${ROWS_S:-280}" python3 benchmarks/bench_linear_gla.py --out "$OUT/h200_linear_gla.json" \
        --ops ${ROWS_OPS:-linear gla_scalar gla_vector gla_vector_strong} --T ${ROWS_T:-2048 8192 32768} \
        --fla-ops ${ROWS_FLA-linear gla_scalar gla_vector gla_vector_strong} --no-step --breakdown-T 2>&1 | tail -n 40
fi
