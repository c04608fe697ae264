#!/usr/bin/env bash
# GPU records of the efficiency tasks (throughput, memory) on one H200, preset "gpu":
# B·T = 65,536 tokens, H = 16, K = V = 128, bf16, T = 512 .. 65,536 (memory: .. 262,144).
#
# Run from the repo root on the device, one task and a group of mixers per call (each call
# must end inside the device's 10-minute limit; the harness stops itself at 9.5 minutes
# with SIGINT, so a cut run leaves no partial record and the finished ones are kept):
#
#   bash benchmarks/gpu_efficiency.sh throughput softmax,linear,gla        # ~5 min
#   bash benchmarks/gpu_efficiency.sh throughput deltanet,gdn              # ~4 min
#   bash benchmarks/gpu_efficiency.sh throughput lin_gdn,mesa              # ~4 min
#   bash benchmarks/gpu_efficiency.sh memory softmax,linear,gla,deltanet,gdn,lin_gdn,mesa  # ~4 min
#
# with carry=[".whl"] (and ".triton" for the Triton of benchmarks/triton_carry.sh): .whl/*.whl is FLA (fla-core, the comparison columns) and
# .whl/harness/*.whl is pydantic and its dependencies for Python 3.12 (the device image has
# no pydantic). Everything lands in $OUT: <task>_<mixers>.tar.gz (the records and their
# PNGs, laid out as results/; extract with `tar -xzf FILE -C results`), <task>_<mixers>.log
# and env.txt. COMPARE_FLA=0: no FLA column. TIME_LIMIT=seconds (default 570) stops the run with SIGINT. DEVICE=cpu PRESET=tiny runs the same steps on a CPU (a check of the script). PRESET=... overrides the preset (e.g. PRESET=tiny for a 1-minute smoke run);
# arguments after the mixers go to `harness run` as they are, e.g.
#   bash benchmarks/gpu_efficiency.sh throughput mesa --set mixer.backend=torch
set -uo pipefail
cd "$(dirname "$0")/.."

TASK=${1:?usage: gpu_efficiency.sh throughput|memory MIXER[,MIXER...]}
MIXERS=${2:-softmax,linear,gla,deltanet,gdn,lin_gdn,mesa}
PRESET=${PRESET:-gpu}
OUT=${OUT:-/tmp/gpu_efficiency_out}
TAG="${TASK}_${MIXERS//,/_}"
RESULTS=/tmp/gpu_efficiency_results/$TAG  # one folder per call: the tarball holds only its runs
mkdir -p "$OUT" "$RESULTS"

DEVICE=${DEVICE:-cuda}
source benchmarks/carried_wheels.sh
# with .triton carried (benchmarks/triton_carry.sh), that Triton runs instead of the image's
if [ -d .triton ]; then source benchmarks/triton_carry.sh install || exit 1; fi
# The device gets a copy of the tree without .git: pass the commit in (HARNESS_GIT_COMMIT=...).
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=disabled PYTHONUNBUFFERED=1

# What ran where: versions, the GPU, which softmax backends and FLA import.
python3 - >"$OUT/env.txt" 2>&1 <<'EOF'
import importlib, platform, torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda)
print("device", torch.cuda.get_device_name() if torch.cuda.is_available() else "NO CUDA")
for mod in ("triton", "pydantic", "fla", "flash_attn", "tasks.builtin", "mixers.builtin"):
    try:
        m = importlib.import_module(mod)
        print(mod, getattr(m, "__version__", "ok"))
    except Exception as e:  # noqa: BLE001
        print(mod, "FAILED:", type(e).__name__, e)
EOF
cat "$OUT/env.txt"
python3 -c "import tasks.builtin, mixers.builtin" || { echo "the harness does not import here; see env.txt"; exit 1; }

EXTRA=()
# COMPARE_FLA=0 leaves FLA's column out (its first calls autotune for minutes on a fresh machine)
[ "$TASK" = throughput ] && [ "${COMPARE_FLA:-1}" = 1 ] && EXTRA=(--set "compare=[fla]")
timeout -s INT "${TIME_LIMIT:-570}" python3 -m harness.cli run --mixer "$MIXERS" --task "$TASK" --preset "$PRESET" --device "$DEVICE" \
    "${EXTRA[@]}" "${@:3}" --results "$RESULTS" --no-wandb 2>&1 | tee "$OUT/$TAG.log"
status=${PIPESTATUS[0]}

tar -czf "$OUT/$TAG.tar.gz" -C "$RESULTS" .
ls -la "$OUT"
exit "$status"
