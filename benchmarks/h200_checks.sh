#!/usr/bin/env bash
# GPU correctness of the newest defaults, then MesaNet's CG sweep with FLA side by side and
# our linear/GLA rows, in one device call; every stage has its own limit (seconds) and the
# JSONs are rewritten after each measurement, so a cut stage keeps what it measured.
#
#   bash benchmarks/h200_checks.sh        # with carry=[".whl"]; results land in $OUT
#
# MESA_TESTS_S, TESTS_S, MESA_S, ROWS_S: stage limits; MESA_T: lengths of the MesaNet rows;
# MESA_VARIANTS: JSON list of CG settings for bench_mesa.py's sweep (its default list if empty).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/h200_checks_out}
source benchmarks/device_preamble.sh
run_tests() {  # limit, log name, pytest arguments...
    local limit=$1 log=$2; shift 2
    timeout -s INT "$limit" python3 -m pytest -q -s -p no:cacheprovider -rA "$@" 2>&1 \
        | grep -E "GPU-ERR|passed|failed|PASSED|FAILED|Error" | tee "$OUT/$log"
}
[ "${MESA_TESTS_S:-110}" -gt 0 ] && run_tests "${MESA_TESTS_S:-110}" gpu_tests_mesa.log tests/gpu/test_mesa_gpu.py
[ "${TESTS_S:-80}" -gt 0 ] && run_tests "${TESTS_S:-80}" gpu_tests_new.log \
    tests/gpu/test_linear_gla_gpu.py::test_bf16_fused_forward tests/gpu/test_lin_gdn_gpu.py tests/gpu/test_step_gpu.py
if [ "${MESA_S:-200}" -gt 0 ]; then
    # shellcheck disable=SC2086
    timeout -s INT "${MESA_S:-200}" python3 benchmarks/bench_mesa.py --out "$OUT/h200_mesa.json" \
        --T ${MESA_T:-2048} --skip curve accuracy ${MESA_VARIANTS:+--variants "$MESA_VARIANTS"} 2>&1 | tail -n 25
fi
if [ "${ROWS_S:-60}" -gt 0 ]; then
    timeout -s INT "${ROWS_S:-60}" python3 benchmarks/bench_linear_gla.py --out "$OUT/h200_linear_gla.json" \
        --fla-ops --no-step --breakdown-T 2>&1 | tail -n 12
fi
ls -la "$OUT"
