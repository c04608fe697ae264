"""Whether 30 CG steps are enough on MesaNet's strong-gate GPU test case (tests/gpu/test_mesa_gpu.py
bf16_T2100_strong_vs_exact: B 2, H 2, T 2100, gates -6 U(0, 1), bf16-rounded q, k, v), on
the CPU: the chunked PyTorch form at `steps` CG steps in fp64 and in fp32 against the exact
per-token solve (kernels/mesa/reference.py) in fp64, every output and gradient as the GPU
test measures it (whole-tensor and worst-row relative error). The inputs are drawn on the
CPU (the GPU test draws its own with the CUDA generator: same distributions, other numbers).

    python -m benchmarks.mesa_cg_convergence --out results/findings/mesa_cg_convergence_cpu.json
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NAMES = ("o", "h_kk", "h_kv", "dq", "dk", "dv", "dg", "dbeta", "dlamb", "dh_kk0", "dh_kv0")


def inputs(T: int, K: int, seed: int = 0) -> list:
    """The GPU case's leaves (tests/gpu/test_mesa_gpu.py make_inputs, "strong" gates) on the
    CPU in fp64, q, k, v rounded through bf16."""
    import torch
    import torch.nn.functional as F

    B, H, V = 2, 2, K
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    k = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    v = torch.randn(B, T, H, V, generator=gen)
    g = -6.0 * torch.rand(B, T, H, generator=gen)
    beta = torch.sigmoid(torch.randn(B, T, H, generator=gen))
    lamb = F.softplus(torch.rand(H, K, generator=gen)) + 0.25
    a = torch.randn(B, H, K, K, generator=gen) / K
    leaves = [q, k, v, g, beta, lamb, a @ a.transpose(-1, -2), 0.1 * torch.randn(B, H, K, V, generator=gen)]
    return [t.bfloat16().double() if i < 3 else t.double() for i, t in enumerate(leaves)]


def outputs_and_grads(fn, leaves: list, dtype) -> list:
    """o, both final states and every leaf's gradient (fp64) for seeded fp64 cotangents,
    with the leaves cast to `dtype`."""
    import torch

    x = [t.to(dtype).requires_grad_(True) for t in leaves]
    o, final = fn(x)
    outs = (o, final.h_kk, final.h_kv)
    gen = torch.Generator().manual_seed(1234)
    cotangents = [torch.randn(t.shape, generator=gen, dtype=torch.float64).to(dtype) for t in outs]
    return [t.detach().double() for t in (*outs, *torch.autograd.grad(outs, x, cotangents))]


def measure(T: int, K: int, steps: int) -> dict:
    import torch

    from kernels.mesa import mesa
    from kernels.mesa.reference import mesa_reference
    from kernels.mesa.state import MesaState
    from tests.util import rel_err, row_err

    leaves = inputs(T, K)
    scale = K**-0.5
    exact = outputs_and_grads(lambda x: mesa_reference(*x[:6], scale, initial_state=MesaState(*x[6:]),
                                                       output_final_state=True), leaves, torch.float64)
    found = {"T": T, "K": K, "cg_steps": steps}
    for name, dtype in (("fp64", torch.float64), ("fp32", torch.float32)):
        started = time.time()
        got = outputs_and_grads(lambda x: mesa(*x[:6], scale=scale, initial_state=MesaState(*x[6:]),
                                               output_final_state=True, backend="torch", chunk_size=64,
                                               cg_steps=steps), leaves, dtype)
        found[f"torch_{name}"] = {"seconds": round(time.time() - started, 1),
                                  "rel_err": {n: rel_err(a, b) for n, a, b in zip(NAMES, got, exact)},
                                  "row_err": {n: row_err(a, b) for n, a, b in zip(NAMES, got, exact)}}
    return found


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--seq-len", type=int, default=2100)
    p.add_argument("--head-dims", type=int, nargs="+", default=[128, 64])
    p.add_argument("--cg-steps", type=int, default=30)
    args = p.parse_args()
    import torch

    from benchmarks.json_record import save_record

    record = {"what": __doc__.split("\n\n")[0].replace("\n", " "), "device": f"CPU ({platform.machine()})",
              "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "runs": []}
    for K in args.head_dims:
        record["runs"].append(measure(args.seq_len, K, args.cg_steps))
        run = record["runs"][-1]
        print(K, {form: {n: f"{e:.1e}" for n, e in run[f"torch_{form}"]["row_err"].items()} for form in ("fp64", "fp32")},
              flush=True)
        save_record(record, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
