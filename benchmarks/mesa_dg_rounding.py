"""MesaNet's fp32 strong-gate NaN case (tests/gpu/test_nan_cases_gpu.py: B 2, H 2, K = V = 128,
100 CG steps) run by the CPU interpreter, to tell how near its bounds the case sits off the
GPU and whether an inexact exp2 moves it: each run's worst-row error of every output and
gradient against the fp64 recurrence, with the interpreter's exp2 exact or multiplied by
1 + u 2^-23 ulps (u uniform in [-1, 1]; the GPU's ex2.approx is off by about 2 ulps).

    python -m benchmarks.mesa_dg_rounding --out results/findings/mesa_dg_rounding_cpu.json
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAPE = {"B": 2, "H": 2, "K": 128, "V": 128}  # tests/gpu/test_nan_cases_gpu.py


def run(T: int, ulps: float, seed: int = 0) -> dict:
    """Worst-row errors of one case with exp2 perturbed by `ulps` (0: exact)."""
    import numpy as np
    import torch
    from triton.runtime import interpreter

    from tests.nan_cases import make_leaves, outputs_and_grads, over_bounds

    builder = interpreter.InterpreterBuilder
    exact = builder.create_exp2
    if ulps:
        rng = np.random.default_rng(seed)

        def noisy_exp2(x):
            y = np.exp2(x)
            return (y * (1 + rng.uniform(-1, 1, np.shape(y)) * ulps * 2.0**-23)).astype(y.dtype)

        builder.create_exp2 = lambda self, arg: self.unary_op(arg, noisy_exp2)
    try:
        leaves = make_leaves("mesa", T, "strong", False, **SHAPE)
        started = time.time()
        ours = outputs_and_grads("mesa", leaves, torch.float32, "triton", cg_steps=100)
        ref = outputs_and_grads("mesa", leaves, torch.float64, "reference")
        errors, _ = over_bounds("mesa", "strong", ours, ref, "triton", torch.float32)
    finally:
        builder.create_exp2 = exact
    return {"T": T, "exp2_ulps": ulps, "seconds": round(time.time() - started, 1),
            "worst_row": {name: pair[1] for name, pair in errors.items()}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--lengths", type=int, nargs="+", default=[100, 130])
    p.add_argument("--ulps", type=float, nargs="+", default=[0.0, 2.0, 8.0])
    args = p.parse_args()
    os.environ["TRITON_INTERPRET"] = "1"
    import torch
    import triton

    from benchmarks.json_record import save_record

    record = {"what": __doc__.split("\n\n")[0].replace("\n", " "), "device": f"CPU interpreter ({platform.machine()})",
              "torch": torch.__version__, "triton": triton.__version__, "date": time.strftime("%Y-%m-%d"), "runs": []}
    for T in args.lengths:
        for ulps in args.ulps:
            record["runs"].append(run(T, ulps))
            print(record["runs"][-1], flush=True)
            save_record(record, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
