#!/usr/bin/env bash
# MQAR on one H200 (device tool, from the repo root, carry .whl): one run alone for its
# steps/s, then a sweep file packed 16 runs to the GPU. Records are tarred into $OUT every
# 20 s, so a call cut short keeps every run that finished.
#   SWEEP=configs/mqar-ablation-gpu.yaml SWEEP_S=420 bash benchmarks/h200_mqar.sh
set -o pipefail
source benchmarks/device_preamble.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=disabled HARNESS_CACHE=/tmp/hcache
SWEEP=${SWEEP:-configs/mqar-ablation-gpu.yaml}
SWEEP_S=${SWEEP_S:-420}
PACK=${PACK:-16}
R=/tmp/results
mkdir -p "$R"
( while true; do sleep 20; tar czf "$OUT/records.tgz.tmp" -C "$R" . 2>/dev/null && mv "$OUT/records.tgz.tmp" "$OUT/records.tgz"; done ) &
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 15 >"$OUT/smi.csv" 2>&1 &
h() { python3 -m harness.cli "$@"; }
if [ -n "${ALONE:-1}" ] && [ "${ALONE:-1}" != 0 ]; then
    echo "== alone: gdn, zoology preset, 1 epoch"
    start=$(date +%s)
    h run --mixer gdn --task mqar --preset zoology --device cuda --no-wandb --results "$R/alone" \
        --set model.mixer.backend=torch --set optim.epochs=1 --set optim.early_stop=null --set optim.lr=1e-2 \
        2>&1 | tail -n 5 | tee "$OUT/alone.log"
    echo "alone wall $(( $(date +%s) - start )) s" | tee -a "$OUT/alone.log"
fi
echo "== sweep $SWEEP, $PACK runs on the GPU, ${SWEEP_S}s"
start=$(date +%s)
timeout "$SWEEP_S" python3 -m harness.cli sweep "$SWEEP" --executor gpus --runs-per-gpu "$PACK" --results "$R/sweep" --no-wandb \
    >"$OUT/sweep.log" 2>&1
echo "sweep rc $? wall $(( $(date +%s) - start )) s" | tee -a "$OUT/sweep.log"
tail -n 40 "$OUT/sweep.log"
tar czf "$OUT/records.tgz" -C "$R" .
ls "$R"/sweep/.sweep/logs 2>/dev/null | head; for f in "$R"/sweep/.sweep/logs/*; do tail -n 3 "$f"; done 2>/dev/null | tail -n 40 >"$OUT/workers_tail.log"
