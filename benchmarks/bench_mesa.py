"""Speed and accuracy of the Triton MesaNet (kernels/mesa/triton_*.py) against FLA 0.6.0.

    PYTHONPATH=/tmp/site:. python benchmarks/bench_mesa.py --out results/bench/h200_mesa.json

Shapes (as in /work/shared/anchors): B*T = 65,536 tokens, H = 16, K = V = 128, bf16 q, k
(unit rows), v; g = logsigmoid(N(4, 1)), beta = sigmoid(N(0, 1)) and lamb = softplus(U(0, 1))
+ 0.25 in fp32 (FLA's own example), T in {2048, 8192, 32768}, 30 CG iterations for both
(FLA's default max_CG_iteration). Sections, in the order they run, the JSON rewritten after
each so a run cut short keeps what it measured:
  sweep     time of the forward and backward solve kernels for each VARIANT at T = 8192,
            q*, o and y checked against the first variant's (the default),
            with the compiled kernels' registers, spills and shared memory; the correct one
            with the least fwd + bwd time is "fast" (JSON: tuning_fast, fast_variant)
  states    (with --states-variants) the four state passes per launch variant at each
            --states-T (benchmarks/mesa_states_sweep.py); the best joins "fast"
  rows      per T (curve after the first T, accuracy last): fwd and fwd+bwd medians (triton.testing.do_bench) of ours (default and
            fast settings) and FLA's chunk_mesa_net, ratios, peak memory, o against FLA's,
            and the time of each of our kernels (default and fast settings)
  curve     relative error of q* after n CG iterations against the exact solve (fp64),
            ours and the torch backend's (kernels/mesa/cg.py), for two ridges
  accuracy  o, final states and every gradient of the fast settings against the torch
            chunked backend in fp64 with the same cg_steps
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.mesa_states_sweep import flat_settings, mesa_changes, states_sweep
from benchmarks.timing import rel_diff, save_record, time_fwd_fwdbwd
from kernels.common import launch as kl
from kernels.common.chunking import split_chunks
from kernels.mesa import triton_solve
from kernels.mesa.cg import _exact_solution, cg_residual_curve
from kernels.mesa.chunked import mesa_chunked
from kernels.mesa.state import MesaState
from kernels.mesa.triton_op import mesa_triton
from kernels.mesa.triton_solve import mesa_bwd_solve, mesa_fwd_solve
from kernels.mesa.triton_states import mesa_fwd_states

CG_STEPS = 30
# the settings a sweep variant sets, by their flat names (mesa_states_sweep.FLAT_KEYS; a
# variant leaving one out takes the one in effect)
SWEEP_KEYS = ("rows", "bwd_rows", "solve_warps", "weights_scan", "diag_prec", "cg_operands")
FAST_PROLOGUE = {"weights_scan": 1, "diag_prec": "cg"}  # no fp32 FMA dots before the CG loop
VARIANTS = [  # settings of the CG kernels tried in the sweep; the first is the reference of the checks
    # the default (session 5), then the two other operand forms (earlier sweeps: results/bench/h200_mesa.json)
    {"rows": 64, "bwd_rows": 32, "solve_warps": 8, **FAST_PROLOGUE, "cg_operands": "fp16_normed"},
    {"rows": 64, "bwd_rows": 32, "solve_warps": 8, **FAST_PROLOGUE, "cg_operands": "fp16_scaled"},
    {"rows": 32, "solve_warps": 8, **FAST_PROLOGUE, "cg_operands": "fp32"},
]


DEVICE = "cuda"
SMALL_T, SMALL_H = 2048, 4  # shape of the curve and accuracy sections (B = 1)


def make_inputs(B, T, H, D, seed=0, lamb_lo=0.25):
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    dev = DEVICE
    q = F.normalize(torch.randn(B, T, H, D, device=dev, generator=gen), dim=-1).to(torch.bfloat16)
    k = F.normalize(torch.randn(B, T, H, D, device=dev, generator=gen), dim=-1).to(torch.bfloat16)
    v = torch.randn(B, T, H, D, device=dev, generator=gen).to(torch.bfloat16)
    g = F.logsigmoid(4.0 + torch.randn(B, T, H, device=dev, generator=gen))
    beta = torch.sigmoid(torch.randn(B, T, H, device=dev, generator=gen))
    lamb = F.softplus(torch.rand(H, D, device=dev, generator=gen)) + lamb_lo
    do = torch.randn(B, T, H, D, device=dev, generator=gen).to(torch.bfloat16)
    return [q, k, v, g, beta, lamb], do


def Tuned(over):
    """The block under a sweep variant's settings (flat keys, mesa_changes: its rows are both
    solves' unless it names bwd_rows)."""
    return kl.launch_settings(mesa=mesa_changes(over))


def ours_fn(leaves, scale):
    return lambda: mesa_triton(*leaves, scale=scale, cg_steps=CG_STEPS)[0]


def fla_fn(leaves):
    """FLA's forward on the same tensors. FLA does not scale q: timing is unaffected; the
    cross-check passes it scale * q."""
    from fla.ops.mesa_net import chunk_mesa_net

    q, k, v, g, beta, lamb = leaves
    return lambda q=q: chunk_mesa_net(q, k, v, g, beta, lamb, max_CG_iteration=CG_STEPS)[0]


def compiled_info(name):
    """Registers per thread, spilled registers and shared memory of the latest launch of a
    solve kernel ("fwd" or "bwd")."""
    kernel = triton_solve.LAST_COMPILED.get(name)
    try:
        return {"n_regs": kernel.n_regs, "n_spills": kernel.n_spills, "shared_bytes": kernel.metadata.shared}
    except Exception as e:  # noqa: BLE001 - attribute names differ across Triton versions
        return {"error": f"{type(e).__name__}: {str(e)[:200]}"}


def settings(over=None):
    """The SWEEP_KEYS of the mesa settings in effect, with a variant's changes."""
    with Tuned(over):
        flat = flat_settings()
    return {k: flat[k] for k in SWEEP_KEYS}


def launch_of(over=None, backward=False):
    """The solve kernels' SolveLaunch in effect with a variant's changes (the backward's
    with backward=True)."""
    with Tuned(over):
        current = kl.settings("mesa")
    return current.bwd_solve if backward else current.fwd_solve


def dump_asm(folder, tag):
    """Write the TTGIR and cubin of the latest fwd and bwd solve launches (for offline
    reading with cuobjdump -sass: spills, layouts, shared memory)."""
    os.makedirs(folder, exist_ok=True)
    for name in ("fwd", "bwd"):
        try:
            asm = triton_solve.LAST_COMPILED[name].asm
            with open(os.path.join(folder, f"{tag}_{name}.ttgir"), "w") as f:
                f.write(asm["ttgir"])
            with open(os.path.join(folder, f"{tag}_{name}.cubin"), "wb") as f:
                f.write(asm["cubin"])
        except Exception as e:  # noqa: BLE001 - diagnostics only
            print("dump_asm", tag, name, type(e).__name__, e, flush=True)


def sweep(T, H, D, tokens, asm_dir=None):
    """Forward and backward solve kernels alone for each VARIANT; q*, o, y checked against
    the first variant's; fwd_steps0_ms is the forward without CG iterations (what the
    prologue and the output cost). Returns (records, the fastest correct variant's
    settings, its index)."""
    leaves, do = make_inputs(max(1, tokens // T), T, H, D)
    q, k, v, g, beta, lamb = leaves
    scale = D**-0.5
    h_kk, _ = mesa_fwd_states(k, k, g, beta, None, False, 64, "tf32")
    h_kv, _ = mesa_fwd_states(k, v, g, beta, None, False, 64, "tf32")
    out, first = [], None
    for i, over in enumerate(VARIANTS):
        rec = settings(over)
        launch, bwd_launch = launch_of(over), launch_of(over, backward=True)
        try:
            def fwd(launch=launch, steps=CG_STEPS):
                return mesa_fwd_solve(q, k, v, g, beta, lamb, h_kk, h_kv, scale, steps, None, 64,
                                      "tf32", "tf32", launch)

            q_star, o = fwd()
            rec["fwd_kernel"] = compiled_info("fwd")
            # every variant's backward starts from the same q* (the reference's), so y compares
            q_star_in = q_star if first is None else first[0]

            def bwd(launch=bwd_launch, q_star_in=q_star_in):
                return mesa_bwd_solve(k, v, g, beta, lamb, h_kk, h_kv, q_star_in, do, scale, CG_STEPS, None, 64,
                                      "tf32", "tf32", q.dtype, launch)

            y = bwd()[0]
            rec["bwd_kernel"] = compiled_info("bwd")
            if asm_dir:
                dump_asm(asm_dir, f"variant{i}")
            first = first or (q_star, o, y)
            rec["q_star_vs_first"] = rel_diff(q_star, first[0])
            rec["o_vs_first"] = rel_diff(o, first[1])
            rec["y_vs_first"] = rel_diff(y, first[2])
            rec["fwd_ms"] = do_bench(fwd, warmup=10, rep=50, return_mode="median")
            rec["bwd_ms"] = do_bench(bwd, warmup=10, rep=50, return_mode="median")
            rec["fwd_steps0_ms"] = do_bench(lambda: fwd(steps=0), warmup=10, rep=50, return_mode="median")
        except Exception as e:  # noqa: BLE001 - a variant that fails to compile or run is recorded
            rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        print("sweep", rec, flush=True)
        out.append(rec)
    ok = [i for i, r in enumerate(out) if "bwd_ms" in r and r["q_star_vs_first"] < 1e-3
          and r["o_vs_first"] < 1e-2 and r["y_vs_first"] < 1e-3]
    if not ok:
        return out, settings(), None
    best = min(ok, key=lambda i: out[i]["fwd_ms"] + out[i]["bwd_ms"])
    return out, settings(VARIANTS[best]), best


def kernel_breakdown(leaves, do, scale):
    """Median ms of each stage of ours (the launch settings in effect)."""
    from kernels.mesa.triton_grads import mesa_bwd_grads
    from kernels.mesa.triton_solve import mesa_bwd_solve
    from kernels.mesa.triton_states import mesa_bwd_states

    q, k, v, g, beta, lamb = (x.detach() for x in leaves)
    launch, bwd_launch, states = launch_of(), launch_of(backward=True), kl.settings("mesa").states
    h_kk, _ = mesa_fwd_states(k, k, g, beta, None, False, 64, "tf32", states)
    h_kv, _ = mesa_fwd_states(k, v, g, beta, None, False, 64, "tf32", states)
    q_star, _ = mesa_fwd_solve(q, k, v, g, beta, lamb, h_kk, h_kv, scale, CG_STEPS, None, 64, "tf32", "tf32", launch)
    y, _, e, _ = mesa_bwd_solve(k, v, g, beta, lamb, h_kk, h_kv, q_star, do, scale, CG_STEPS, None, 64, "tf32",
                                "tf32", q.dtype, bwd_launch)
    dh_kk, _, d1 = mesa_bwd_states(y, q_star, g, h_kk, None, -1.0, False, 64, "tf32", states)
    dh_kv, _, d2 = mesa_bwd_states(q_star, do, g, h_kv, None, 1.0, False, 64, "tf32", states)
    steps = {
        "fwd_states_x2": lambda: (mesa_fwd_states(k, k, g, beta, None, False, 64, "tf32", states),
                                  mesa_fwd_states(k, v, g, beta, None, False, 64, "tf32", states)),
        "fwd_solve": lambda: mesa_fwd_solve(q, k, v, g, beta, lamb, h_kk, h_kv, scale, CG_STEPS, None, 64, "tf32",
                                            "tf32", launch),
        "bwd_solve": lambda: mesa_bwd_solve(k, v, g, beta, lamb, h_kk, h_kv, q_star, do, scale, CG_STEPS, None, 64,
                                            "tf32", "tf32", q.dtype, bwd_launch),
        "bwd_states_x2": lambda: (mesa_bwd_states(y, q_star, g, h_kk, None, -1.0, False, 64, "tf32", states),
                                  mesa_bwd_states(q_star, do, g, h_kv, None, 1.0, False, 64, "tf32", states)),
        "bwd_grads": lambda: mesa_bwd_grads(k, v, g, beta, q_star, y, do, dh_kk, dh_kv, e, d1 + d2, 64, "tf32",
                                            num_warps=kl.settings("mesa").grads.num_warps),
    }
    return {name: do_bench(fn, warmup=5, rep=30, return_mode="median") for name, fn in steps.items()}


def residual_curves(D, counts):
    """Relative error of q* vs the exact solve after n iterations, ours and torch's."""
    out = {}
    for name, lamb_lo in (("lamb_softplus+0.25", 0.25), ("lamb_small_0.01", None)):
        leaves, _ = make_inputs(1, SMALL_T, SMALL_H, D, seed=3, lamb_lo=lamb_lo or 0.0)
        q, k, v, g, beta, lamb = leaves
        if lamb_lo is None:
            lamb = 0.01 + 0.01 * torch.rand_like(lamb)
        scale = D**-0.5
        exact = _exact_solution(q, k, g, beta, lamb, scale, None, 64)  # [B, H, N, C, K] fp64
        h_kk, _ = mesa_fwd_states(k, k, g, beta, None, False, 64, "tf32")
        h_kv, _ = mesa_fwd_states(k, v, g, beta, None, False, 64, "tf32")
        ours = {}
        for n in counts:
            q_star, _ = mesa_fwd_solve(q, k, v, g, beta, lamb, h_kk, h_kv, scale, n, None, 64, "tf32", "tf32",
                                       launch_of())
            ours[n] = rel_diff(split_chunks(q_star, 64), exact)
        torch_curve = cg_residual_curve(q, k.float(), g, beta, lamb, counts, scale=scale, chunk_size=64)
        out[name] = {"ours_triton_tf32": ours, "torch_fp32": torch_curve}
        print("curve", name, out[name], flush=True)
    return out


def accuracy(over, D):
    """Errors of ours (under a variant's settings `over`) vs the fp64 chunked form, same cg_steps."""
    leaves, _ = make_inputs(1, SMALL_T, SMALL_H, D, seed=5)
    gen = torch.Generator(device=DEVICE).manual_seed(9)
    state = [torch.randn(1, SMALL_H, D, D, device=DEVICE, generator=gen) / D,
             0.1 * torch.randn(1, SMALL_H, D, D, device=DEVICE, generator=gen)]
    state[0] = state[0] @ state[0].transpose(-1, -2)
    ours = [x.detach().clone().requires_grad_(True) for x in leaves + state]
    ref = [x.detach().double().requires_grad_(True) for x in ours]
    with Tuned(over):
        o, fin = mesa_triton(*ours[:6], scale=D**-0.5, initial_state=MesaState(*ours[6:]), output_final_state=True,
                             cg_steps=CG_STEPS)
        cots = [torch.randn(t.shape, device=DEVICE, generator=gen).to(t.dtype) for t in (o, *fin)]
        got = [o, *fin, *torch.autograd.grad((o, *fin), ours, cots)]
    o_r, fin_r = mesa_chunked(*ref[:6], D**-0.5, initial_state=MesaState(*ref[6:]), output_final_state=True,
                              cg_steps=CG_STEPS)
    want = [o_r, *fin_r, *torch.autograd.grad((o_r, *fin_r), ref, [c.double() for c in cots])]
    names = ["o", "h_kk", "h_kv", "dq", "dk", "dv", "dg", "dbeta", "dlamb", "dh_kk0", "dh_kv0"]
    return {n: rel_diff(a, b) for n, a, b in zip(names, got, want)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results/bench/h200_mesa.json")
    ap.add_argument("--tokens", type=int, default=65536)
    ap.add_argument("--T", type=int, nargs="+", default=[2048, 8192, 32768])
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--skip", nargs="*", default=[], help="sections to leave out: sweep curve accuracy fla")
    ap.add_argument("--tune", default="", help='JSON settings (flat keys, mesa_states_sweep.FLAT_KEYS) for the '
                    'whole run, e.g. {"rows": 32}')
    ap.add_argument("--variants", default="", help='JSON list replacing VARIANTS, e.g. [{"rows": 32, '
                    '"solve_warps": 8}] (keys of SWEEP_KEYS, others as in effect; the first is the '
                    'reference of the checks)')
    ap.add_argument("--states-variants", default="", help='JSON list of state-pass settings (flat keys) timed '
                    'per T of --states-T (benchmarks/mesa_states_sweep.py; the first is the reference), '
                    'e.g. [{}, {"states_BK": 128}]; the best joins the fast settings')
    ap.add_argument("--states-T", type=int, nargs="+", default=[2048, 32768])
    ap.add_argument("--asm", default="", help="folder for the TTGIR and cubin of each sweep variant's kernels")
    args = ap.parse_args()
    with Tuned(json.loads(args.tune) if args.tune else {}):
        run(args)


def run(args):
    if args.variants:
        VARIANTS[:] = json.loads(args.variants)
    import importlib.metadata as md

    versions = {"torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version()}
    try:
        versions["fla-core"] = md.version("fla-core")
    except md.PackageNotFoundError:
        versions["fla-core"] = None
    record = {
        "variants": VARIANTS,
        "what": "Triton MesaNet (this repo) vs FLA 0.6.0 chunk_mesa_net; median ms (triton.testing.do_bench); "
        f"bf16 q/k/v, fp32 g/beta/lamb, B*T={args.tokens}, H={args.H}, K=V={args.D}, {CG_STEPS} CG iterations",
        "device": torch.cuda.get_device_name(), "versions": versions, "tuning_default": kl.settings_in_effect(["mesa"])["mesa"],
        "date": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": [],
    }
    def save():
        save_record(record, args.out)

    fast, record["fast_variant"] = settings(), "default (sweep skipped)"
    if "sweep" not in args.skip:
        record["sweep_T8192"], fast, best = sweep(8192, args.H, args.D, args.tokens, args.asm or None)
        record["fast_variant"] = (f"VARIANTS[{best}] (least fwd + bwd solve ms among the correct ones)"
                                  if best is not None else "default (no variant passed the checks)")
    if args.states_variants:
        record["states_sweep"], best_states = states_sweep(make_inputs, args.states_T, args.H, args.D, args.tokens,
                                                           json.loads(args.states_variants))
        record["states_fast_variant"] = best_states
        fast = {**fast, **(best_states or {})}
    record["tuning_fast"] = fast
    print("fast settings:", fast, record["fast_variant"], flush=True)
    save()
    sections = [("row", args.T[0]), ("curve", None)] + [("row", T) for T in args.T[1:]] + [("accuracy", None)]
    for kind, T in sections:
        if kind == "curve" and "curve" not in args.skip:
            record["cg_residual_curve_T2048"] = residual_curves(args.D, [0, 1, 2, 3, 4, 6, 8, 12, 16, 20, 25, 30, 40, 50])
        elif kind == "accuracy" and "accuracy" not in args.skip:
            record["accuracy_vs_chunked_fp64_T2048"] = {"default": accuracy({}, args.D)}
            if fast != settings():
                record["accuracy_vs_chunked_fp64_T2048"]["fast"] = accuracy(fast, args.D)
            print("accuracy", record["accuracy_vs_chunked_fp64_T2048"], flush=True)
        elif kind == "row":
            B = max(1, args.tokens // T)
            leaves, do = make_inputs(B, T, args.H, args.D)
            scale = args.D**-0.5
            row = {"B": B, "T": T, "H": args.H, "D": args.D, "times": {}}
            record["rows"].append(row)  # saved as it fills up
            cands = {"ours": ours_fn(leaves, scale)}
            if "fla" not in args.skip:
                try:
                    cands["fla"] = fla_fn(leaves)
                except ImportError as e:  # FLA is optional: comparison only
                    row["fla_error"] = f"{type(e).__name__}: {e}"
            if fast != settings():
                cands["ours_fast"] = ours_fn(leaves, scale)
            for name, fn in cands.items():
                with Tuned(fast if name == "ours_fast" else {}):
                    row["times"][name] = time_fwd_fwdbwd(fn, leaves, do)
                print(T, name, row["times"][name], flush=True)
                save()
            t = row["times"]
            for ours in ("ours", "ours_fast"):
                for key in ("fwd_ms", "fwdbwd_ms"):
                    if key in t.get(ours, {}) and key in t.get("fla", {}):
                        row.setdefault("ratios", {})[f"{ours}/fla:{key}"] = t[ours][key] / t["fla"][key]
            if "fla" in cands:
                try:
                    with torch.no_grad():
                        row["o_rel_diff_vs_fla"] = rel_diff(cands["ours"](), cands["fla"](leaves[0] * scale))
                except Exception as e:  # noqa: BLE001 - comparison only
                    row["o_rel_diff_vs_fla"] = f"{type(e).__name__}: {str(e)[:200]}"
            row["kernels_ms"] = kernel_breakdown(leaves, do, scale)
            if fast != settings():
                with Tuned(fast):
                    row["kernels_ms_fast"] = kernel_breakdown(leaves, do, scale)
            print(T, "ratios", row.get("ratios"), "vs fla", row.get("o_rel_diff_vs_fla"), "\n  kernels",
                  row["kernels_ms"], "\n  kernels (fast)", row.get("kernels_ms_fast"), flush=True)
            del leaves, do, cands
            torch.cuda.empty_cache()
        save()


if __name__ == "__main__":
    main()
