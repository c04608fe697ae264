"""Screen launch settings of one op's Triton kernels for register spills, without a GPU: each
variant's training step (forward and backward, bf16 by default, no state) is compiled for sm_90 and not
run (tests/compile_sm90.py's CompileOnly), and cuobjdump reports each kernel's registers and
spill stack. Run it under the Triton the device has (PYTHONPATH to a `pip install --target`
of that version) to see that compiler's code.

    python benchmarks/spill_screen.py --op gated_delta_rule --head-dim 128 --out F.json
    python benchmarks/spill_screen.py --head-dim 64 --value-dim 128 --dtype fp32 --matmul-precision high \
        --batch 2 --seq-len 256 --default-only --out F.json   # the MQAR shape, fp32 with TF32 dots

A variant is one kernel's field changes (kernels/common/launch/); each is compiled once.
Spilling is a hint where to look, not a time: the kernels task times candidates on the GPU.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "tests"))  # after ROOT: tests/benchmarks must not shadow benchmarks/

# kernel -> {field: values} of the delta rules' launch settings (DeltaLaunch)
DELTA_GRID = {
    "wy_fwd": {"BK": [32, 64, 128], "BV": [32, 64], "num_warps": [2, 4]},
    "state_fwd": {"BV": [32, 64], "num_warps": [4, 8]},
    "output_fwd": {"BK": [64, 128], "BV": [64, 128], "num_warps": [4, 8]},
    "du_local": {"BK": [64, 128], "BV": [64, 128], "num_warps": [4, 8]},
    "state_bwd": {"BV": [32, 64], "num_warps": [4, 8]},
    "dqkw": {"BK": [32, 64], "BV": [32, 64], "num_warps": [4, 8]},
    "wy_bwd": {"BK": [32, 64], "BV": [32, 64], "num_warps": [2, 4]},
}


def variants(grid: dict[str, dict[str, list]]) -> list[tuple[str, dict]]:
    out = []
    for kernel, fields in grid.items():
        names = list(fields)
        for values in itertools.product(*(fields[n] for n in names)):
            out.append((kernel, dict(zip(names, values))))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--op", default="gated_delta_rule", choices=["gated_delta_rule", "delta_rule"])
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--value-dim", type=int, default=None, help="V (default: the head dim)")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--matmul-precision", default="highest", choices=["highest", "high"],
                   help="torch's fp32 matmul precision at launch: fp32 dots are 'ieee' at highest, 'tf32' at high")
    p.add_argument("--dot-precision", default="auto", choices=["auto", "ieee", "tf32", "tf32x3"],
                   help="screen every kernel dot at this input precision instead of the kernels' own choice "
                        "(dot_precision); --solve-precision likewise for the delta rules' chunk inverse")
    p.add_argument("--solve-precision", default="auto", choices=["auto", "ieee", "tf32", "tf32x3"])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq-len", type=int, default=200)
    p.add_argument("--default-only", action="store_true", help="only the default launch settings, no variants")
    p.add_argument("--out", required=True, type=Path)
    args = p.parse_args()

    import torch
    import triton
    from compile_sm90 import CompileOnly, training_step
    from triton.runtime.jit import JITFunction

    from kernels.common.launch import launch_settings

    stand_in = CompileOnly(resources=True)
    JITFunction.run = lambda self, *a, **kw: stand_in(self, *a, **kw)
    D = args.head_dim
    torch.set_float32_matmul_precision(args.matmul_precision)
    step = training_step(args.op, None, D, dtype=args.dtype, value_dim=args.value_dim, batch=args.batch,
                         seq_len=args.seq_len)
    # Override the precision helpers where the kernel modules imported them (a screen of what the
    # compiler makes of another choice; the kernels themselves are unchanged), once the step
    # has imported them.
    for helper, choice in (("dot_precision", args.dot_precision), ("solve_precision", args.solve_precision)):
        if choice != "auto":
            for module in [m for name, m in sys.modules.items() if name.startswith("kernels.")]:
                if hasattr(module, helper):
                    setattr(module, helper, lambda *_, fixed=choice: fixed)

    rows = []
    for kernel, changes in [("default", {})] + ([] if args.default_only else variants(DELTA_GRID)):
        before = set(stand_in.done) | set(stand_in.failed)
        started = time.time()
        with launch_settings(**{args.op: {kernel: changes}} if changes else {}):
            step()
        for key in (set(stand_in.done) | set(stand_in.failed)) - before:
            name = key[0].removesuffix("_kernel")
            if kernel != "default" and name != kernel:
                continue
            usage = stand_in.usage.get(key, stand_in.failed.get(key, ""))
            rows.append({"variant": kernel, "changes": changes, "kernel": name,
                         "constexprs": {k: v for k, v in dict(key[1]).items() if k.startswith("B")},
                         "options": dict(key[3]), "resources": usage,
                         "failed": key in stand_in.failed})
        print(f"{kernel:10s} {changes} ({time.time() - started:.1f} s)", flush=True)
    record = {"what": __doc__.split("\n\n")[0], "op": args.op, "head_dim": D, "value_dim": args.value_dim or D,
              "dtype": args.dtype, "matmul_precision": args.matmul_precision, "dot_precision": args.dot_precision,
              "solve_precision": args.solve_precision, "batch": args.batch,
              "seq_len": args.seq_len, "triton": triton.__version__,
              "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "rows": rows}
    from benchmarks.json_record import save_text

    save_text(json.dumps(record, indent=1) + "\n", args.out)
    for r in rows:
        print(f"{r['kernel']:11s} {str(r['constexprs']):40s} {str(r['options']):36s} {r['resources']}")


if __name__ == "__main__":
    main()
