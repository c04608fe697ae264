"""Speed of the Triton linear attention / GLA kernels, side by side with FLA 0.6.0.

    python benchmarks/bench_linear_gla.py --out results/bench/h200_linear_gla.json

Shapes (docs/design.md §9, anchors/): B*T = 65,536 tokens, H = 16, K = V = 128, bf16, T in
{2048, 8192, 32768}; l2-normalised keys, gates logsigmoid(N(4, 1)). Times are medians of
triton.testing.do_bench (ms) of the Triton entry points (validation skipped on both sides),
forward and forward+backward (random output gradient), with ratios ours / FLA. FLA is a
comparison only (`fla.ops.linear_attn.chunk_linear_attn(normalize=False)`,
`fla.ops.simple_gla.chunk_simple_gla`, `fla.ops.gla.chunk_gla`); where it raises, the error
is recorded. Also: rel. difference of our outputs/gradients to FLA's, and the fused decode
step against the PyTorch step. The JSON is rewritten after every measurement.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.timing import rel_diff, time_fwd_fwdbwd

TOKENS, H, D = 65536, 16, 128
# gla_vector_strong: vector gates so negative (about -2 nats a token) that no chunk factors
# whole; the rows and breakdowns record which path of triton_vector.py each chunk took
OPS = ("linear", "gla_scalar", "gla_vector", "gla_vector_strong")


def make_inputs(T: int, op: str, seed: int = 0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    B = TOKENS // T
    q = torch.randn(B, T, H, D, device="cuda", generator=gen, dtype=torch.bfloat16)
    k = F.normalize(torch.randn(B, T, H, D, device="cuda", generator=gen), dim=-1).bfloat16()
    v = torch.randn(B, T, H, D, device="cuda", generator=gen, dtype=torch.bfloat16)
    g = None
    if op != "linear":
        vector = op.startswith("gla_vector")
        shape = (B, T, H, D) if vector else (B, T, H)
        shift = -2.0 if op == "gla_vector_strong" else 4.0
        g = F.logsigmoid(torch.randn(shape, device="cuda", generator=gen) + shift)
    return q, k, v, g


def ours(op: str):
    from kernels.gated_linear_attention.triton_op import gated_linear_attention_triton
    from kernels.linear_attention.triton_op import linear_attention_triton

    if op == "linear":
        return lambda q, k, v, g: linear_attention_triton(q, k, v, scale=D**-0.5)
    return lambda q, k, v, g: gated_linear_attention_triton(q, k, v, g, scale=D**-0.5)


def fla_impl(op: str):
    if op == "linear":
        from fla.ops.linear_attn import chunk_linear_attn

        return lambda q, k, v, g: chunk_linear_attn(q, k, v, scale=D**-0.5, normalize=False)
    if op == "gla_scalar":
        from fla.ops.simple_gla import chunk_simple_gla

        return lambda q, k, v, g: chunk_simple_gla(q, k, v, g=g, scale=D**-0.5)
    from fla.ops.gla import chunk_gla

    return lambda q, k, v, g: chunk_gla(q, k, v, g=g, scale=D**-0.5)


def time_one(fn, q, k, v, g, do):
    """(row, o, grads): fwd ms without autograd (inference), fwd+bwd ms and peak extra MiB
    (benchmarks/timing.py), the output and the gradients of q, k, v (g) for the cross-check;
    an error in the backward (FLA refuses some on this Triton) is recorded in the row."""
    from triton.testing import do_bench

    row = {}
    with torch.no_grad():
        o_fwd = fn(q, k, v, g)[0]
        row["fwd_ms"] = do_bench(lambda: fn(q, k, v, g), warmup=25, rep=100, return_mode="median")
    leaves = [t.detach().clone() for t in (q, k, v, g) if t is not None]
    args = leaves + ([None] if g is None else [])
    row.update(time_fwd_fwdbwd(lambda: fn(*args)[0], leaves, do, time_forward=False))
    grads = None
    if "bwd_error" not in row:
        grads = [t.detach() for t in torch.autograd.grad(fn(*args)[0], leaves, do)]
    return row, o_fwd, grads


def bench_step(results: dict) -> None:
    """Fused Triton decode step (kernels/common/triton/step.py) vs the PyTorch step of each
    linear op through its public step function, B = 32, H = 16, K = V = 128, bf16 inputs,
    fp32 state."""
    from triton.testing import do_bench

    from kernels import (
        delta_rule_step,
        gated_delta_rule_step,
        gated_linear_attention_step,
        linear_attention_step,
    )

    B = 32
    q, v = (torch.randn(B, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    k = F.normalize(torch.randn(B, H, D, device="cuda"), dim=-1).bfloat16()
    state = torch.randn(B, H, D, D, device="cuda")
    g_vec = F.logsigmoid(torch.randn(B, H, D, device="cuda") + 4.0)
    g_sc = F.logsigmoid(torch.randn(B, H, device="cuda") + 4.0)
    beta = torch.sigmoid(torch.randn(B, H, device="cuda"))
    steps = {
        "linear": lambda be: linear_attention_step(q, k, v, state, backend=be),
        "gla_scalar": lambda be: gated_linear_attention_step(q, k, v, g_sc, state, backend=be),
        "gla_vector": lambda be: gated_linear_attention_step(q, k, v, g_vec, state, backend=be),
        "deltanet": lambda be: delta_rule_step(q, k, v, beta, state, backend=be),
        "gdn": lambda be: gated_delta_rule_step(q, k, v, g_sc, beta, state, backend=be),
    }
    with torch.no_grad():
        for op, fn in steps.items():
            ms_torch = do_bench(lambda fn=fn: fn("torch"), warmup=25, rep=100, return_mode="median")
            ms_triton = do_bench(lambda fn=fn: fn("triton"), warmup=25, rep=100, return_mode="median")
            diff = rel_diff(fn("triton")[1], fn("torch")[1])
            results["decode_step"].append({
                "op": op, "B": B, "H": H, "K": D, "V": D, "torch_ms": ms_torch, "triton_ms": ms_triton,
                "ratio_triton_over_torch": ms_triton / ms_torch, "state_rel_diff": diff,
            })


def pipeline_kernels(op: str, T: int) -> dict:
    """Zero-argument calls of each kernel of our pipeline for `op` at one T (inputs made
    once; intermediate inputs computed with the launch settings in effect)."""
    from kernels.common.triton.cumsum import chunk_local_cumsum
    from kernels.common.triton.fused_forward import chunk_fwd_fused
    from kernels.common.triton.gates import LOG2E
    from kernels.common.triton.grad_qk import chunk_bwd_dqk
    from kernels.common.triton.output import chunk_bwd_dv, chunk_fwd_output
    from kernels.common.triton.states import chunk_bwd_states, chunk_fwd_states
    from kernels.gated_linear_attention.triton_function import gate_mode
    from kernels.gated_linear_attention.triton_vector import gla_bwd_dqkg, gla_intra_A

    BT, scale = 64, D**-0.5
    q, k, v, g = make_inputs(T, op, seed=1)
    do = torch.randn_like(v)
    gate = gate_mode(g)
    gamma = chunk_local_cumsum(g, BT, LOG2E) if g is not None else None
    h, _ = chunk_fwd_states(k, v, gamma, gate, None, False, BT)
    vector = op.startswith("gla_vector")
    A = gla_intra_A(q, k, gamma, scale, BT) if vector else None
    dh, _ = chunk_bwd_states(q, do, gamma, gate, None, False, scale, BT)
    steps = {
        "fwd_fused": lambda: chunk_fwd_fused(q, k, v, gamma, gate, A, None, False, scale, BT)[0],
        "fwd_states": lambda: chunk_fwd_states(k, v, gamma, gate, None, False, BT)[0],
        "fwd_output": lambda: chunk_fwd_output(q, k, v, h, gamma, gate, A, scale, BT),
        "bwd_states": lambda: chunk_bwd_states(q, do, gamma, gate, None, False, scale, BT)[0],
        "bwd_dv": lambda: chunk_bwd_dv(q, k, do, dh, gamma, gate, A, scale, BT),
    }
    if g is not None:
        steps["cumsum"] = lambda: chunk_local_cumsum(g, BT, LOG2E)
    if vector:
        steps["intra_A"] = lambda: gla_intra_A(q, k, gamma, scale, BT)
        steps["bwd_dqkg"] = lambda: gla_bwd_dqkg(q, k, v, do, h, dh, gamma, scale, BT)[0]
    else:
        steps["bwd_dqk"] = lambda: chunk_bwd_dqk(q, k, v, do, h, dh, gamma, gate, scale, BT)[0]
    return steps


def bench_breakdown(results: dict, Ts: list[int], ops: list[str], variants: list[dict]) -> None:
    """Median time of each kernel of our pipeline (where the time goes), with the default
    launch settings and with each variant (a dict of ChunkLaunch changes, kernels/common/launch.py,
    e.g. {"fwd_states": {"BK": 128, "min_BV": 32}}, applied to linear_attention and
    gated_linear_attention alike); each variant's kernel outputs are compared with the default's."""
    from triton.testing import do_bench

    from kernels.common.launch import launch_settings
    from kernels.gated_linear_attention.triton_vector import path_shares

    for T in Ts:
        for op in ops:
            steps = pipeline_kernels(op, T)
            ref = {name: fn().float() for name, fn in steps.items()}
            for variant in [{}] + variants:
                row = {"op": op, "T": T, "B": TOKENS // T, "variant": variant}
                try:
                    with launch_settings(linear_attention=variant, gated_linear_attention=variant):
                        if op.startswith("gla_vector"):
                            q, _, _, g = make_inputs(T, op, seed=1)
                            row["paths"] = path_shares(g, q.dtype)
                            del q, g
                        for name, fn in steps.items():
                            if variant and not any(name.startswith(v) or v.startswith(name) for v in variant):
                                continue  # a variant times only the kernels it changes
                            out = fn().float()
                            row[name + "_ms"] = do_bench(fn, warmup=10, rep=50, return_mode="median")
                            if variant:
                                row[name + "_rel_diff"] = rel_diff(out, ref[name])
                except Exception as exc:  # noqa: BLE001 - a setting that does not compile: say so, go on
                    row["error"] = f"{type(exc).__name__}: {exc}"[:300]
                results["breakdown"].append(row)
                print("breakdown", json.dumps(row), flush=True)
            del steps, ref
            torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--T", type=int, nargs="*", default=[2048, 8192, 32768], help="T of the rows (none: no rows)")
    parser.add_argument("--ops", nargs="+", default=list(OPS), choices=OPS)
    parser.add_argument("--fla-ops", nargs="*", default=list(OPS), choices=OPS,
                        help="ops timed with FLA too (none: ours only)")
    parser.add_argument("--no-step", action="store_true")
    parser.add_argument("--breakdown-T", type=int, nargs="*", default=[8192],
                        help="T of the per-kernel breakdown (none: no breakdown)")
    parser.add_argument("--variants", default="[]",
                        help='JSON list of ChunkLaunch changes (kernels/common/launch.py) timed in the breakdown, '
                             'e.g. [{"fwd_states": {"BK": 128}}]')
    parser.add_argument("--breakdown-first", action="store_true", help="run the breakdown before the rows")
    args = parser.parse_args()

    import triton

    versions = {"python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__}
    try:
        import fla

        versions["fla"] = getattr(fla, "__version__", "?")
    except ImportError:
        args.fla_ops = []
    results = {
        "what": "Triton linear attention / GLA (this repo) vs FLA chunk kernels; medians of "
        "triton.testing.do_bench in ms; B*T = 65536, H = 16, K = V = 128, bf16",
        "device": torch.cuda.get_device_name(), "versions": versions,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "rows": [], "decode_step": [], "breakdown": [],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def save():
        args.out.write_text(json.dumps(results, indent=1))

    if args.breakdown_T and args.breakdown_first:
        bench_breakdown(results, args.breakdown_T, args.ops, json.loads(args.variants))
        save()
    from kernels.gated_linear_attention.triton_vector import path_shares

    # op by op: FLA's first chunk_gla call autotunes for minutes, so the cheap ops come first
    for op in args.ops:
        for T in args.T:
            q, k, v, g = make_inputs(T, op, seed=T)
            do = torch.randn_like(v)
            row = {"op": op, "B": TOKENS // T, "T": T, "H": H, "K": D, "V": D}
            if op.startswith("gla_vector"):
                row["paths"] = path_shares(g, q.dtype)
            r_ours, o_ours, g_ours = time_one(ours(op), q, k, v, g, do)
            row["ours"] = r_ours
            results["rows"].append(row)
            save()  # ours first: FLA's autotuning (chunk_gla: minutes) may outlast the run
            print(json.dumps(row), flush=True)
            if op in args.fla_ops:
                r_fla, o_fla, g_fla = time_one(fla_impl(op), q, k, v, g, do)
                row["fla"] = r_fla
                row["o_rel_diff_vs_fla"] = rel_diff(o_ours, o_fla)
                if g_ours is not None and g_fla is not None:
                    names = ["dq", "dk", "dv", "dg"]
                    row["grad_rel_diff_vs_fla"] = {n: rel_diff(a, b) for n, a, b in zip(names, g_ours, g_fla)}
                for mode in ("fwd_ms", "fwdbwd_ms"):
                    if mode in r_ours and mode in r_fla:
                        row[f"ratio_{mode[:-3]}"] = r_ours[mode] / r_fla[mode]
                save()
                print(json.dumps(row), flush=True)
            del q, k, v, g, do, o_ours, g_ours
            torch.cuda.empty_cache()
    if not args.no_step:
        bench_step(results)
        save()
    if args.breakdown_T and not args.breakdown_first:
        bench_breakdown(results, args.breakdown_T, args.ops, json.loads(args.variants))
        save()

    print(f"\n{'op':<11}{'T':>6} | {'ours fwd':>9}{'FLA fwd':>9}{'ratio':>7} | {'ours f+b':>9}{'FLA f+b':>9}{'ratio':>7}")
    for row in results["rows"]:
        o, f = row["ours"], row.get("fla", {})
        cells = [f"{row['op']:<11}{row['T']:>6} |"]
        for mode in ("fwd_ms", "fwdbwd_ms"):
            ratio = row.get(f"ratio_{mode[:-3]}")
            cells.append(f"{o.get(mode, float('nan')):>9.3f}{f.get(mode, float('nan')):>9.3f}"
                         f"{(ratio if ratio is not None else float('nan')):>7.2f} |")
        print("".join(cells) + (" FLA: " + f["bwd_error"][:60] if "bwd_error" in f else ""))
    for b in results["breakdown"]:
        print("breakdown " + " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in b.items()))
    for s in results["decode_step"]:
        print(f"decode {s['op']:<11} torch {s['torch_ms']*1e3:7.1f} us  triton {s['triton_ms']*1e3:7.1f} us  "
              f"ratio {s['ratio_triton_over_torch']:.2f}")


if __name__ == "__main__":
    main()
