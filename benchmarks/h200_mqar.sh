#!/usr/bin/env bash
# MQAR on one H200 (device tool, from the repo root, carry .whl): the graphed-step GPU tests,
# one run alone per step mode for its steps/s, then the sweep files of SWEEP (space-separated, in
# turn) packed PACK runs to the GPU until DEADLINE_S after the start. Records already in results/runs are copied in first, so
# the sweep resumes across calls. Records are tarred into $OUT every 20 s: a call cut short
# keeps every run that finished.
#   SWEEP=configs/mqar-paper.yaml DEADLINE_S=570 PACK=6 bash benchmarks/h200_mqar.sh
# TESTS=0, ALONE=0 skip those parts; PROFILE=1 adds benchmarks/mqar_step_profile.py first
# (PROFILE_BACKENDS=torch,triton to compare the backends, PROFILE_PRECISIONS=highest,high fp32
# against TF32 matmuls, PROFILE_S its time limit).
set -o pipefail
T0=$(date +%s)
source benchmarks/device_preamble.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=disabled HARNESS_CACHE=/tmp/hcache
SWEEP=${SWEEP:-configs/mqar-paper.yaml}
DEADLINE_S=${DEADLINE_S:-570}
PACK=${PACK:-6}
R=/tmp/results
mkdir -p "$R/sweep"
cp -r results/runs "$R/sweep/" 2>/dev/null
( while true; do sleep 20; tar czf "$OUT/records.tgz.tmp" -C "$R" . 2>/dev/null && mv "$OUT/records.tgz.tmp" "$OUT/records.tgz"; done ) &
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 15 >"$OUT/smi.csv" 2>&1 &
# The device call lasts until every process it started exits: stop the two loops at the end.
trap 'kill $(jobs -p) 2>/dev/null' EXIT
h() { python3 -m harness.cli "$@"; }
if [ "${TESTS:-1}" != 0 ]; then
    echo "== GPU tests of the graphed training step"
    TRITON_INTERPRET=0 python3 -m pytest -q -p no:cacheprovider tests/tasks/test_graphed_step.py 2>&1 | tail -n 15 | tee "$OUT/tests.log"
fi
if [ "${ALONE:-1}" != 0 ]; then
    for mode in false true; do
        for mixer in ${ALONE_MIXERS:-gdn}; do
            echo "== alone: $mixer, zoology preset, d_model 128, 1 epoch, cuda_graph=$mode"
            s=$(date +%s)
            h run --mixer "$mixer" --task mqar --preset zoology --device cuda --no-wandb --results "$R/alone" \
                --set model.mixer.backend=torch --set optim.epochs=1 --set optim.early_stop=null --set optim.lr=1e-2 \
                --set optim.cuda_graph=$mode 2>&1 | tail -n 4 | tee -a "$OUT/alone.log"
            echo "alone $mixer $mode wall $(( $(date +%s) - s )) s" | tee -a "$OUT/alone.log"
        done
    done
fi
if [ "${PROFILE:-0}" != 0 ]; then
    echo "== step profile (zoology model, eager vs graphed, top kernels)"
    timeout "${PROFILE_S:-150}" python3 -m benchmarks.mqar_step_profile --out "$OUT/mqar_step_profile_h200.json" \
        --backends "${PROFILE_BACKENDS:-torch}" --precisions "${PROFILE_PRECISIONS:-highest}" 2>&1 | tail -n 20 | tee "$OUT/profile.log"
fi
for sweep in $SWEEP; do
    left=$(( DEADLINE_S - ($(date +%s) - T0) ))
    [ "$left" -gt 30 ] || break
    name=$(basename "$sweep" .yaml)
    echo "== sweep $sweep, $PACK runs on the GPU, ${left}s"
    s=$(date +%s)
    timeout "$left" python3 -m harness.cli sweep "$sweep" --executor gpus --runs-per-gpu "$PACK" --results "$R/sweep" \
        --no-wandb >"$OUT/sweep-$name.log" 2>&1
    echo "sweep $name rc $? wall $(( $(date +%s) - s )) s" | tee -a "$OUT/sweep-$name.log"
    tail -n 30 "$OUT/sweep-$name.log"
done
tar czf "$OUT/records.tgz" -C "$R" .
for f in "$R"/sweep/.sweep/logs/*; do echo "== $f"; tail -n 3 "$f"; done 2>/dev/null | tail -n 60 >"$OUT/workers_tail.log"
