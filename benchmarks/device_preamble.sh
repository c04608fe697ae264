# Sourced by the device scripts (from the repo root, with OUT set): the output folder, the
# carried wheels (carried_wheels.sh), unbuffered Python, and $OUT/env.txt naming the GPU,
# driver and versions the results come from.
mkdir -p "$OUT"
source benchmarks/carried_wheels.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv >"$OUT/env.txt" 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >>"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
