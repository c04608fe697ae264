#!/usr/bin/env bash
# Kernel benchmarks on one H200 in one device call (each stage has its own time limit, and
# each benchmark rewrites its JSON after every measurement, so a cut stage keeps what it
# measured): the delta rules with per-kernel tuning variants, then linear attention / GLA,
# both side by side with FLA 0.6.0 in the same process.
#
#   bash benchmarks/h200_kernels.sh            # with carry=[".whl"]; results land in $OUT
#
# DELTA_S / LINEAR_S: seconds for each stage (defaults 170 / 330).
# VARIANTS: JSON list of DeltaLaunch changes (kernels/common/launch.py) timed per kernel at T = 8192 (bench_delta.py --variants;
# none by default: the variants of 2026-11-29 are adopted, results/bench/h200_delta.json).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/h200_kernels_out}
source benchmarks/device_preamble.sh

VARIANTS=${VARIANTS:-}  # e.g. '[{"wy_fwd": {"BK": 128, "BV": 128}}]'
timeout -s INT "${DELTA_S:-170}" python3 benchmarks/bench_delta.py --out "$OUT/h200_delta.json" \
    --variants "$VARIANTS" --variants-T 8192 2>&1 | tee "$OUT/delta.log"
timeout -s INT "${LINEAR_S:-330}" python3 benchmarks/bench_linear_gla.py --out "$OUT/h200_linear_gla.json" \
    --breakdown-T 2>&1 | tee "$OUT/linear_gla.log"
ls -la "$OUT"
