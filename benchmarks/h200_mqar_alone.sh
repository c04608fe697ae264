#!/usr/bin/env bash
# Steps/s of each mixer alone on the GPU and a fresh process's start-up: the zoology preset
# cut to 100 steps at its longest training setting (T=256, 64 pairs), one process per mixer.
#   bash benchmarks/h200_mqar_alone.sh   (device tool, carry .whl)
set -o pipefail
source benchmarks/device_preamble.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=disabled HARNESS_CACHE=/tmp/hcache
R=/tmp/results
for m in ${MIXERS:-gdn softmax deltanet gla linear lin_gdn mesa}; do
    start=$(date +%s.%N)
    python3 -m harness.cli run --mixer "$m" --task mqar --preset zoology --device cuda --no-wandb --results "$R" \
        --set model.mixer.backend=torch --set optim.epochs=1 --set optim.early_stop=null --set optim.lr=1e-2 \
        --set 'train=[{seq_len: 256, num_kv_pairs: 64, num_examples: 25600}]' \
        --set 'test=[{seq_len: 256, num_kv_pairs: 64, num_examples: 256}]' >/dev/null 2>&1
    echo "$m wall_s $(echo "$(date +%s.%N) - $start" | bc)" | tee -a "$OUT/alone_wall.txt"
    tar czf "$OUT/records.tgz" -C "$R" .
done
