#!/usr/bin/env bash
# MQAR on one H200 (device tool, from the repo root, carry .whl): the graphed-step GPU tests,
# one run alone per step mode for its steps/s, then the sweep files of SWEEP (space-separated, in
# turn) packed PACK runs to the GPU until DEADLINE_S after the start. Records already in
# results/runs are copied in first, so the sweep resumes across calls. The files this call writes
# (new records, the sweep's logs) are tarred into $OUT/records.tgz every 20 s: a call cut short
# keeps every run that finished. The training states of runs still going at the deadline come
# back gzipped as $OUT/resume.tgz.part-* (15 MiB pieces, up to RESUME_MB; a d_model 256 state is
# ~28 MiB and a call returns 64 MiB, and carries up 64 MiB with the tree and the wheels, so one
# 256 state resumes per call); `cat` them into .resume-carry/resume.tgz
# (or unpack them into .resume-carry/) and carry it on the next call, and those runs go on from
# their last epoch. Logs come back in logs.tgz, the background GPU tests' in gpu_tests.tgz.
# CACHE_BACK=1 brings Inductor's compile cache back too ($OUT/inductor-cache.tgz.part-*: `cat`
# them into .resume-carry/inductor-cache.tgz), and a call that finds it there starts from it.
#   SWEEP=configs/mqar-paper.yaml DEADLINE_S=570 PACK=6 bash benchmarks/h200_mqar.sh
# SWEEP_ARGS: more options of `harness sweep` (e.g. --mixer gdn --where model.d_model=256). START_FOR=S: runs start only in
# the sweep's first S seconds (a run started later is cut at the deadline, its state may not fit
# the 64 MiB a call returns, and it slows the runs that will finish).
# From a snapshot (benchmarks/devtree.sh builds .devtree with the wheels and resume states):
#   cd .devtree && TESTS=0 ALONE=0 PACK=4 DEADLINE_S=555 bash benchmarks/h200_mqar.sh   (carry [".devtree"])
# ALONE_MIXERS, ALONE_BACKENDS (default gdn, torch) choose the runs alone, e.g. ALONE_MIXERS=mesa
# ALONE_BACKENDS="torch triton" to weigh MesaNet's Triton CG against its PyTorch one; ALONE_ARGS adds
# options to those runs (e.g. "--set optim.compile=true --set model.d_model=64").
# TESTS=0, ALONE=0 skip those parts (TEST_FILES: other test files); TESTS_BG=1 runs the GPU test
# files of TEST_FILES_BG (default tests/gpu/test_*.py) beside the sweep, one process per file (their
# Triton compiles use the CPU cores the graphed sweep leaves idle), logs and each file's errors
# (GPU_ERRORS_JSON) in $OUT/gpu_tests/; PROFILE=1 adds benchmarks/mqar_step_profile.py first
# (PROFILE_BACKENDS=torch,triton to compare the backends, PROFILE_PRECISIONS=highest,high fp32
# against TF32 matmuls, PROFILE_COMPILE=none,inductor eager against torch.compile'd steps,
# PROFILE_MIXERS which mixers, PROFILE_S its time limit); VARIANTS=1 adds
# benchmarks/mqar_step_variants.py (VARIANTS_MIXERS, VARIANTS_S) after it; WARM (below) fills the
# compile caches before the sweep; MPS=1 shares the GPU between the packed
# runs through CUDA's Multi-Process Service.
set -o pipefail
T0=$(date +%s)
source benchmarks/device_preamble.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=disabled HARNESS_CACHE=/tmp/hcache
SWEEP=${SWEEP:-configs/mqar-paper.yaml}
DEADLINE_S=${DEADLINE_S:-570}
PACK=${PACK:-6}
R=/tmp/results
# A warm machine keeps /tmp from the call before: its records and states must not come back again.
rm -rf "$R" && mkdir -p "$R/sweep"
cp -r results/runs "$R/sweep/" 2>/dev/null
# Only what this call writes goes back (the copied records hold megabytes of NIAH heatmaps,
# room the training states need).
touch "$R/.t0"
pack_new() { ( cd "$R" && find . -type f -newer .t0 ! -path '*/.resume/*' ! -path './stopped/*' >"$1.list" && tar czf "$1" -T "$1.list" && rm -f "$1.list" ); }
# Training states of runs a previous call cut short (carried up in .resume-carry): they resume.
if [ -f .resume-carry/resume.tgz ]; then
    mkdir -p "$R/sweep/.resume" && tar xzf .resume-carry/resume.tgz -C "$R/sweep/.resume/"
elif [ -d .resume-carry ]; then mkdir -p "$R/sweep/.resume" && cp -r .resume-carry/. "$R/sweep/.resume/"; fi
LOGS=$OUT/logs
mkdir -p "$LOGS"
( while true; do sleep 20; pack_new "$OUT/records.tgz.tmp" 2>/dev/null && mv "$OUT/records.tgz.tmp" "$OUT/records.tgz"; done ) &
SNAPSHOTS=$!
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 15 >"$LOGS/smi.csv" 2>&1 &
# The device call lasts until every process it started exits: stop the two loops at the end.
trap 'kill $(jobs -p) 2>/dev/null' EXIT
h() { python3 -m harness.cli "$@"; }
# Stops a background subshell and the command it is waiting on (a sleep left running would hold
# the device call open until it ends).
stop_job() { kill -STOP "$1" 2>/dev/null; pkill -P "$1"; kill -KILL "$1" 2>/dev/null; wait "$1" 2>/dev/null; }
# MPS=1: the runs packed on the GPU share it through CUDA's Multi-Process Service, so kernels of
# different runs execute at once instead of time-slicing the GPU between processes. The daemon is
# per user and leaves the card's compute mode as it is; if a CUDA client cannot start under it,
# the daemon quits and the sweep runs without it (the log says which).
if [ "${MPS:-0}" != 0 ]; then
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    if nvidia-cuda-mps-control -d && timeout 90 python3 -c "import torch; x = torch.ones(4, device='cuda'); print('mps client ok', float(x.sum()))"; then
        echo "== MPS on" | tee -a "$LOGS/mps.log"
        MPS_ON=1
        # Bounded: MPS's quit waits for its clients, and a worker stuck in the driver would hold
        # the call to its limit with nothing printed.
        trap 'echo quit | timeout 15 nvidia-cuda-mps-control; kill $(jobs -p) 2>/dev/null' EXIT
    else
        echo "== MPS could not start: running without it" | tee -a "$LOGS/mps.log"
        echo quit | nvidia-cuda-mps-control 2>/dev/null
        unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    fi
    cp -r /tmp/mps-log "$LOGS/" 2>/dev/null
fi
if [ "${TESTS:-1}" != 0 ]; then
    echo "== GPU tests: ${TEST_FILES:=tests/tasks/test_graphed_step.py}"
    TRITON_INTERPRET=0 python3 -m pytest -q -p no:cacheprovider $TEST_FILES 2>&1 | tail -n 15 | tee "$LOGS/tests.log"
fi
BG_TESTS=()
if [ "${TESTS_BG:-0}" != 0 ]; then
    mkdir -p "$OUT/gpu_tests"
    for f in ${TEST_FILES_BG:-tests/gpu/test_*.py}; do
        n=$(basename "$f" .py)
        GPU_ERRORS_JSON="$OUT/gpu_tests/$n.json" TRITON_INTERPRET=0 timeout -s INT "$(( DEADLINE_S - 45 ))" \
            python3 -m pytest -q -s -p no:cacheprovider -rA "$f" >"$OUT/gpu_tests/$n.log" 2>&1 &
        BG_TESTS+=($!)
    done
    echo "== GPU tests in the background: ${#BG_TESTS[@]} files"
fi
if [ "${ALONE:-1}" != 0 ]; then
    for mode in false true; do
        for mixer in ${ALONE_MIXERS:-gdn}; do
          for backend in ${ALONE_BACKENDS:-torch}; do
            echo "== alone: $mixer ($backend backend), zoology preset, d_model 128, 1 epoch, cuda_graph=$mode"
            s=$(date +%s)
            h run --mixer "$mixer" --task mqar --preset zoology --device cuda --no-wandb --results "$R/alone" \
                --set model.mixer.backend=$backend --set optim.epochs=1 --set optim.early_stop=null --set optim.lr=1e-2 \
                --set optim.cuda_graph=$mode $ALONE_ARGS 2>&1 | tail -n 4 | tee -a "$LOGS/alone.log"
            echo "alone $mixer $backend $mode wall $(( $(date +%s) - s )) s" | tee -a "$LOGS/alone.log"
          done
        done
    done
fi
if [ "${PROFILE:-0}" != 0 ]; then
    echo "== step profile (zoology model, eager vs graphed, top kernels)"
    timeout "${PROFILE_S:-150}" python3 -m benchmarks.mqar_step_profile --out "$LOGS/mqar_step_profile_h200.json" \
        --backends "${PROFILE_BACKENDS:-torch}" --precisions "${PROFILE_PRECISIONS:-highest}" \
        --compile "${PROFILE_COMPILE:-none}" --mixers "${PROFILE_MIXERS:-gdn,softmax,deltanet,mesa}" 2>&1 | tail -n 20 | tee "$LOGS/profile.log"
fi
if [ "${VARIANTS:-0}" != 0 ]; then
    echo "== step variants: conv and triangular-solve forms in compiled, graphed steps"
    timeout "${VARIANTS_S:-300}" python3 -m benchmarks.mqar_step_variants --out "$LOGS/mqar_step_variants_h200.json" \
        --mixers "${VARIANTS_MIXERS:-gdn,mesa}" --explain-mixers "${VARIANTS_EXPLAIN:-gdn,mesa}" 2>&1 | tail -n 20 | tee "$LOGS/variants.log"
fi
# A sweep file that compiles its steps (optim.compile: true) is checked first on this GPU: one
# compiled step of each mixer of COMPILE_CHECK_MIXERS (default gdn) against the eager one. If
# one fails, the sweep runs eagerly (a copy of the file with compile off; records then say
# compiled false) and the log says why.
# Inductor's compile workers per run: the packed runs share the host's cores and memory.
export TORCHINDUCTOR_COMPILE_THREADS=${TORCHINDUCTOR_COMPILE_THREADS:-4}
# One cache for the warm-ups and every run (the workers inherit it).
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/inductor-cache}
# A previous call's compile cache (CACHE_BACK below), carried up in .resume-carry: the runs load
# their graphs and Triton binaries instead of compiling them (the cache keys hold the torch,
# Triton, CUDA and GPU versions and each graph's code, so a changed tree or machine misses).
if [ -f .resume-carry/inductor-cache.tgz ]; then
    mkdir -p "$TORCHINDUCTOR_CACHE_DIR" && tar xzf .resume-carry/inductor-cache.tgz -C "$TORCHINDUCTOR_CACHE_DIR" \
        && echo "== compile cache from the last call: $(du -sh "$TORCHINDUCTOR_CACHE_DIR" | cut -f1)"
fi
warms=()
# WARM="gdn:256 mesa:64" (spaces or commas between groups): fill the compile caches for those
# (mixer, d_model) groups first, one process per group and training length (WARM_LENGTHS,
# default the zoology preset's 64 128 256) side by side, the host's cores shared out (benchmarks/warm_compile_cache.py), so runs packed
# together load their graphs instead of each compiling them at once, from the (first) sweep's own
# config of each group; WARM_SETS: more --set overrides.
# WARM=auto: the groups of the first PACK (or WARM_FIRST) runs still to run (benchmarks/warm_groups.py).
if [ "${WARM:-}" = auto ]; then  # the groups of the first PACK runs the (first) sweep will start
    WARM=$(python3 -m benchmarks.warm_groups ${SWEEP%% *} --results "$R/sweep" --first "${WARM_FIRST:-$PACK}" $SWEEP_ARGS)
    echo "== WARM=auto: ${WARM:-nothing left to run}"
fi
WARM=${WARM//,/ }  # "gdn:256,mesa:64" is read as "gdn:256 mesa:64"
if [ -n "${WARM:-}" ]; then
    s=$(date +%s)
    n_warm=$(( $(echo $WARM | wc -w) * $(echo ${WARM_LENGTHS:-64 128 256} | wc -w) ))
    warm_threads=$(( $(nproc) / n_warm )); [ "$warm_threads" -ge 1 ] || warm_threads=1
    for group in $WARM; do
        for len in ${WARM_LENGTHS:-64 128 256}; do
            TORCHINDUCTOR_COMPILE_THREADS=$warm_threads timeout 300 python3 -m benchmarks.warm_compile_cache \
                --mixer "${group%%:*}" --d-model "${group#*:}" --seq-len "$len" \
                --sweep ${SWEEP%% *} $WARM_SETS \
                >"$LOGS/warm-${group%%:*}-${group#*:}-$len.log" 2>&1 &
            warms+=($!)
        done
    done
    warm_start=$s  # they run beside the compile checks; the sweep waits for them
fi
SWEEPS=""
for sweep in $SWEEP; do
    if grep -q "optim.compile: true" "$sweep"; then
        # One check per mixer of COMPILE_CHECK_MIXERS, side by side (each is mostly compile time).
        checks=()
        for mixer in ${COMPILE_CHECK_MIXERS-gdn}; do  # COMPILE_CHECK_MIXERS="": no check
            timeout 300 python3 -m benchmarks.compile_check --mixer "$mixer" >"$LOGS/compile_check-$mixer.log" 2>&1 &
            checks+=("$mixer:$!")
        done
        failed=""
        for c in "${checks[@]}"; do
            wait "${c#*:}" || failed="$failed ${c%%:*}"
            echo "== compile check ${c%%:*}: $(tail -n 1 "$LOGS/compile_check-${c%%:*}.log")"
        done
        if [ ${#checks[@]} -eq 0 ]; then
            echo "== no compile check (COMPILE_CHECK_MIXERS is empty)"
        elif [ -z "$failed" ]; then
            echo "== compile checks passed"
        else
            echo "== compile check FAILED for$failed, $sweep runs eagerly"
            eager=/tmp/$(basename "$sweep" .yaml)-eager.yaml
            sed 's/optim.compile: true/optim.compile: false/' "$sweep" >"$eager" && sweep=$eager
        fi
    fi
    SWEEPS="$SWEEPS $sweep"
done
if [ ${#warms[@]} -gt 0 ]; then
    wait "${warms[@]}"
    for f in "$LOGS"/warm-*.log; do echo "== $(tail -n 1 "$f" | cut -c1-160)"; done
    echo "== compile caches warmed in $(( $(date +%s) - warm_start )) s"
fi
for sweep in $SWEEPS; do
    left=$(( DEADLINE_S - ($(date +%s) - T0) ))
    [ "$left" -gt 30 ] || break
    name=$(basename "$sweep" .yaml)
    echo "== sweep $sweep, $PACK runs on the GPU, ${left}s"
    s=$(date +%s)
    # SIGINT, not TERM: the workers stop through KeyboardInterrupt, which writes no record; under
    # MPS the runs in flight fault all the same (the records set aside below).
    # 40 s before the deadline every worker still busy prints its Python stacks to its log
    # (SIGUSR1, harness.executors): a run that stalls says where it stood.
    ( sleep $(( left > 80 ? left - 40 : 40 )); pkill -USR1 -f "m harness.executors" ) &
    stacks=$!
    timeout -s INT -k 20 "$left" python3 -m harness.cli sweep "$sweep" --executor gpus --runs-per-gpu "$PACK" --results "$R/sweep" \
        --no-wandb ${START_FOR:+--start-for "$START_FOR"} $SWEEP_ARGS >"$LOGS/sweep-$name.log" 2>&1
    echo "sweep $name rc $? wall $(( $(date +%s) - s )) s" | tee -a "$LOGS/sweep-$name.log"
    stop_job "$stacks"
    tail -n 30 "$LOGS/sweep-$name.log"
done
# Workers run in sessions of their own: a sweep killed at its deadline can leave one running,
# holding GPU memory, and MPS's quit at the exit would wait for it until the call's limit.
if pgrep -f "harness.executors" >/dev/null; then
    echo "== stopping the sweep's leftover workers: $(pgrep -f harness.executors | tr '\n' ' ')"
    pkill -INT -f "harness.executors"; sleep 10; pkill -KILL -f "harness.executors"
fi
if [ ${#BG_TESTS[@]} -gt 0 ]; then
    wait "${BG_TESTS[@]}"
    for f in "$OUT"/gpu_tests/*.log; do echo "== $f"; grep -E "passed|failed|FAILED|Error" "$f" | tail -n 8; done
    # One archive: a call brings back only so many files.
    tar czf "$OUT/gpu_tests.tgz" -C "$OUT" gpu_tests && rm -rf "$OUT/gpu_tests"
fi
# Under MPS, stopping the sweep at its deadline faults the runs still in flight (every one
# records "illegal memory access" within the same second; their epoch-end states are intact and
# resume). Those records say nothing about the runs: they go to $R/stopped, named in the log.
if [ "${MPS_ON:-0}" = 1 ]; then
    python3 - "$R" "$(date +%s)" <<'PY' | tee "$LOGS/stopped.txt"
import datetime, json, shutil, sys
from pathlib import Path
root, now = Path(sys.argv[1]), float(sys.argv[2])
(root / "stopped").mkdir(exist_ok=True)
for rec in sorted((root / "sweep" / "runs").glob("*/*.json")):
    data = json.loads(rec.read_text())
    ended = datetime.datetime.fromisoformat(data["finished"]).timestamp()
    if data["status"] == "failed" and "illegal memory access" in (data["error"] or "") and now - ended < 120:
        shutil.move(rec, root / "stopped" / rec.name)
        print(f"stopped at the deadline, record set aside: {rec.name}")
PY
fi
# The snapshot loop stops first: its last archive, moved in after this one, would replace it
# with an older one (and a cut-off records.tgz.tmp would come back beside it).
stop_job "$SNAPSHOTS"; rm -f "$OUT/records.tgz.tmp"
pack_new "$OUT/records.tgz"
for f in "$R"/sweep/.sweep/logs/*; do echo "== $f"; tail -n 3 "$f"; done 2>/dev/null | tail -n 60 >"$LOGS/workers_tail.log"
for f in "$R"/sweep/.sweep/logs/*; do  # the stacks of runs still going at the deadline
    grep -q "Current thread\|^Thread 0x" "$f" 2>/dev/null && tail -n 200 "$f" >"$LOGS/stacks-$(basename "$f")"
done
if [ -n "$(ls -A "$R/sweep/.resume" 2>/dev/null)" ]; then
    # A call returns at most 64 MiB: the states furthest along come back, up to RESUME_MB (default
    # 58: two d_model 256 states; the records and logs beside them are a few KB).
    ( cd "$R/sweep/.resume" && PYTHONPATH="$OLDPWD${PYTHONPATH:+:$PYTHONPATH}" python3 -m benchmarks.resume_pick --budget-mb "${RESUME_MB:-58}" . ) >"$LOGS/resume_pick.txt"
    tar czf - -C "$R/sweep/.resume" -T "$LOGS/resume_pick.txt" | split -b 15m - "$OUT/resume.tgz.part-"
fi
# CACHE_BACK=1: the compile cache comes back as $OUT/inductor-cache.tgz.part-* when it fits what the
# call may still return (64 MiB less the records, states and logs, CACHE_MB at most); carry it up
# in .resume-carry/ and the next call's runs of the same groups skip their compiles.
if [ "${CACHE_BACK:-0}" != 0 ] && [ -d "$TORCHINDUCTOR_CACHE_DIR" ]; then
    tar czf /tmp/inductor-cache.tgz -C "$TORCHINDUCTOR_CACHE_DIR" --exclude=locks . 2>/dev/null
    used=$(du -cm "$OUT"/records.tgz "$OUT"/resume.tgz.part-* 2>/dev/null | tail -n 1 | cut -f1)
    size=$(du -m /tmp/inductor-cache.tgz | cut -f1)
    room=$(( 60 - used )); [ "$room" -le "${CACHE_MB:-24}" ] || room=${CACHE_MB:-24}
    if [ "$size" -le "$room" ]; then
        split -b 15m /tmp/inductor-cache.tgz "$OUT/inductor-cache.tgz.part-" && echo "== compile cache back: $size MiB"
    else
        echo "== compile cache left behind: $size MiB, room for $room"
    fi
fi
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOGS"
ls -la "$OUT"
