"""Which of MesaNet's 16-bit-path precisions makes its worst rows (MesaLaunch.prec: the dots
outside the CG loops; cg_prec: the CG loops' dots; the solves' operands: fp16 scaled by a
carried norm), on the CPU interpreter: the GPU test's strong-gate case shape (B 2, H 2,
K = V = 128, gates -6 U(0, 1), 30 CG steps) with fp16 inputs (the interpreter has no bf16
dots), the interpreter's dots rounding their fp32 operands to TF32 (10 mantissa bits, to
nearest) where a kernel asks for "tf32" as tensor cores do, against the exact per-token solve
in fp64 on the same fp16-rounded inputs and cotangents. One run per setting: the defaults, each of the
three raised to fp32 alone, and all three.

    python -m benchmarks.mesa_precision_screen --out results/findings/mesa_precision_screen_cpu.json
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

NAMES = ("o", "h_kk", "h_kv", "dq", "dk", "dv", "dg", "dbeta", "dlamb", "dh_kk0", "dh_kv0")
SOLVES = ("fwd_solve", "bwd_solve")
SETTINGS = {
    "defaults": {},
    "prec ieee": {"prec": "ieee"},
    "cg_prec ieee": {"cg_prec": "ieee"},
    "fp32 operands": {part: {"operands": "fp32"} for part in SOLVES},
    "all three": {"prec": "ieee", "cg_prec": "ieee", **{part: {"operands": "fp32"} for part in SOLVES}},
}


def tf32_dots() -> None:
    """Make the interpreter's tl.dot round fp32 operands to TF32 where input_precision asks
    for TF32 (it multiplies them exactly otherwise)."""
    import numpy as np
    from triton._C.libtriton import ir
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    exact_dot = builder.create_dot

    def to_tf32(x):
        bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
        return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)

    def dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if input_precision == ir.INPUT_PRECISION.TF32 and a.data.dtype == np.float32 == b.data.dtype:
            a = interpreter.TensorHandle(to_tf32(a.data), a.dtype)
            b = interpreter.TensorHandle(to_tf32(b.data), b.dtype)
        return exact_dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    builder.create_dot = dot


def measure(T: int, steps: int) -> dict:
    import torch

    from benchmarks.mesa_cg_convergence import inputs
    from kernels.common.launch import launch_settings
    from kernels.mesa import mesa
    from kernels.mesa.reference import mesa_reference
    from kernels.mesa.state import MesaState
    from tests.util import rel_err, row_err

    K = 128
    leaves = [t.half().double() if i < 3 else t for i, t in enumerate(inputs(T, K))]
    scale = K**-0.5

    def outputs_and_grads(fn, dtype):
        """o, both final states and every leaf's gradient (fp64), the leaves in `dtype`; o's
        cotangent rounded through fp16 (the kernels' o and its cotangent are fp16), the
        states' fp32."""
        x = [t.to(dtype).requires_grad_(True) for t in leaves]
        o, final = fn(x)
        outs = (o, final.h_kk, final.h_kv)
        gen = torch.Generator().manual_seed(1234)
        cotangents = [torch.randn(t.shape, generator=gen, dtype=torch.float64) for t in outs]
        cotangents = [c.half() if i == 0 else c.float() for i, c in enumerate(cotangents)]
        return [t.detach().double() for t in (*outs, *torch.autograd.grad(outs, x, [c.to(dtype) for c in cotangents]))]

    exact = outputs_and_grads(lambda x: mesa_reference(*x[:6], scale, initial_state=MesaState(*x[6:]),
                                                       output_final_state=True), torch.float64)

    def triton_fp16(x):
        x = [t.half() if i < 3 else t.float() for i, t in enumerate(x)]
        o, final = mesa(*x[:6], scale=scale, initial_state=MesaState(*x[6:]), output_final_state=True,
                        backend="triton", chunk_size=64, cg_steps=steps)
        return o.float(), final

    found = {}
    for label, changes in SETTINGS.items():
        started = time.time()
        with launch_settings(mesa=changes):
            got = outputs_and_grads(triton_fp16, torch.float32)
        found[label] = {"seconds": round(time.time() - started, 1),
                        "rel_err": {n: rel_err(a, b) for n, a, b in zip(NAMES, got, exact)},
                        "row_err": {n: row_err(a, b) for n, a, b in zip(NAMES, got, exact)}}
        print(label, {n: f"{e:.1e}" for n, e in found[label]["row_err"].items()}, flush=True)
    return found


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--seq-len", type=int, default=2100)
    p.add_argument("--cg-steps", type=int, default=30)
    args = p.parse_args()
    os.environ["TRITON_INTERPRET"] = "1"
    import torch
    import triton

    from benchmarks.json_record import save_record

    tf32_dots()
    record = {"what": __doc__.split("\n\n")[0].replace("\n", " "), "device": f"CPU interpreter ({platform.machine()})",
              "torch": torch.__version__, "triton": triton.__version__, "date": time.strftime("%Y-%m-%d"),
              "T": args.seq_len, "cg_steps": args.cg_steps, "settings": SETTINGS}
    record["runs"] = measure(args.seq_len, args.cg_steps)
    save_record(record, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
