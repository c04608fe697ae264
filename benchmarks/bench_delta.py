"""Speed of the Triton delta rule / gated delta rule against FLA 0.6.0 and torch SDPA.

    PYTHONPATH=/tmp/site:. python benchmarks/bench_delta.py --out results/bench/h200_delta.json

Shapes (as in /work/shared/anchors): B*T = 65,536 tokens, H = 16, K = V = 128, bf16, T in
{2048, 8192, 32768}; k l2-normalised, g = logsigmoid(N(4, 1)), beta = sigmoid(U(0, 1)).
For each T: fwd and fwd+bwd medians (triton.testing.do_bench, ms) of ours, FLA's
chunk_delta_rule / chunk_gated_delta_rule (comparison only; FLA's GDN backward refuses on
Triton < 3.7.1 on Hopper: the error is recorded) and causal SDPA pinned to cuDNN and to
flash; peak extra memory of fwd+bwd; ratios ours / FLA (and / best SDPA); a cross-check of
ours against FLA on the same inputs; and the time of each of our kernels. The JSON is
rewritten after every T, so a run cut short keeps what it measured.
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

from benchmarks.timing import rel_diff, save_record, time_fwd_fwdbwd
from kernels.common.launch import launch_settings, settings_in_effect  # noqa: E402
from kernels.delta_rule.triton_op import delta_rule_triton  # noqa: E402
from kernels.gated_delta_rule import triton_op as gdn_op  # noqa: E402

DELTA_OPS = ("delta_rule", "gated_delta_rule")


def make_inputs(B, T, H, D, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dev, dt = "cuda", torch.bfloat16
    q = torch.randn(B, T, H, D, device=dev, generator=gen).to(dt)
    k = F.normalize(torch.randn(B, T, H, D, device=dev, generator=gen), dim=-1).to(dt)
    v = torch.randn(B, T, H, D, device=dev, generator=gen).to(dt)
    g = F.logsigmoid(4.0 + torch.randn(B, T, H, device=dev, generator=gen))
    beta = torch.sigmoid(torch.rand(B, T, H, device=dev, generator=gen)).to(dt)
    do = torch.randn(B, T, H, D, device=dev, generator=gen).to(dt)
    return q, k, v, g, beta, do


def candidates(q, k, v, g, beta, scale, skip=()):
    """name -> (forward callable returning o, the tensors it differentiates); names starting
    with an entry of `skip` are left out."""
    out = {
        "ours_deltanet": (lambda: delta_rule_triton(q, k, v, beta, scale=scale)[0], (q, k, v, beta)),
        "ours_gdn": (lambda: gdn_op.gated_delta_rule_triton(q, k, v, g, beta, scale=scale)[0], (q, k, v, g, beta)),
    }
    try:
        if "fla" in skip:
            raise ImportError("skipped (--skip fla)")
        from fla.ops.delta_rule import chunk_delta_rule
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        out["fla_deltanet"] = (lambda: chunk_delta_rule(q, k, v, beta, scale=scale)[0], (q, k, v, beta))
        out["fla_gdn"] = (lambda: chunk_gated_delta_rule(q, k, v, g, beta, scale=scale)[0], (q, k, v, g, beta))
    except ImportError as e:  # FLA is optional: comparison only
        print("FLA not importable:", e)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    qs, ks, vs = (x.detach().transpose(1, 2).contiguous() for x in (q, k, v))
    for name, backend in (("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa_flash", SDPBackend.FLASH_ATTENTION)):
        def run(backend=backend):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale)
        if "sdpa" not in skip:
            out[name] = (run, (qs, ks, vs))
    return out


def time_one(fwd, leaves, do):
    """time_fwd_fwdbwd with `do` as the output gradient ([B, T, H, D]; SDPA's outputs are
    [B, H, T, D], so it gets do transposed)."""
    return time_fwd_fwdbwd(fwd, leaves, lambda outs: do if outs[0].shape == do.shape else do.transpose(1, 2))


def cross_check(cands, do):
    """Ours against FLA on the same inputs: outputs, and gradients where FLA runs its backward."""
    res = {}
    for ours, theirs in (("ours_deltanet", "fla_deltanet"), ("ours_gdn", "fla_gdn")):
        if theirs not in cands:
            continue
        (f1, leaves), (f2, _) = cands[ours], cands[theirs]
        o1 = f1()
        o2 = f2()
        res[ours + "_vs_fla_o"] = rel_diff(o1, o2)
        g1 = torch.autograd.grad(o1, leaves, do)
        try:
            g2 = torch.autograd.grad(f2(), leaves, do)
            for name, a, b in zip("q k v g beta".split() if len(leaves) == 5 else "q k v beta".split(), g1, g2):
                res[f"{ours}_vs_fla_d{name}"] = rel_diff(a, b)
        except Exception as e:
            res[ours + "_vs_fla_grad"] = f"not run: {type(e).__name__}"
    return res


def kernel_breakdown(q, k, v, g, beta, do, scale):
    """Median ms of each of our kernels (GDN), forward then backward."""
    from kernels.gated_delta_rule import (
        triton_bwd,
        triton_bwd_grad,
        triton_fwd,
        triton_wy,
        triton_wy_bwd,
    )

    gam, tm, w, u0 = triton_wy.wy_fwd(k, v, beta, g)
    h, u, _, _ = triton_fwd.state_fwd(k, w, u0, gam, None, False)
    du = triton_bwd.du_local(q, k, do, gam, scale)
    dh, _ = triton_bwd.state_bwd(q, k, w, do, du.clone(), gam, None, scale, False)
    dq, dkp, dw, dgp = triton_bwd_grad.dqkw(q, k, u, h, dh, do, du, gam, scale)
    steps = {
        "wy_fwd": lambda: triton_wy.wy_fwd(k, v, beta, g),
        "state_fwd": lambda: triton_fwd.state_fwd(k, w, u0, gam, None, False),
        "output_fwd": lambda: triton_fwd.output_fwd(q, k, u, h, gam, scale),
        # the two above in one pass (DeltaLaunch.fused_fwd), to compare with their sum
        "state_output_fused": lambda: triton_fwd.state_fwd(k, w, u0, gam, None, False, q, scale),
        "du_local": lambda: triton_bwd.du_local(q, k, do, gam, scale),
        "state_bwd": lambda: triton_bwd.state_bwd(q, k, w, do, du.clone(), gam, None, scale, False),
        "dqkw": lambda: triton_bwd_grad.dqkw(q, k, u, h, dh, do, du, gam, scale),
        "wy_bwd": lambda: triton_wy_bwd.wy_bwd(k, v, beta, gam, tm, dw, du, dkp, dgp, g.dtype),
    }
    return {name: do_bench(fn, warmup=10, rep=50, return_mode="median") for name, fn in steps.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results/bench/h200_delta.json")
    ap.add_argument("--tokens", type=int, default=65536)
    ap.add_argument("--T", type=int, nargs="+", default=[2048, 8192, 32768])
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--skip", nargs="*", default=[], help="leave out comparisons: fla, sdpa")
    ap.add_argument("--tune", default="", help='JSON changes of DeltaLaunch (kernels/common/launch.py) for the '
                    'whole run, e.g. {"state_fwd": {"BV": 32}}')
    ap.add_argument("--variants", default="", help="JSON list of DeltaLaunch changes timed per kernel")
    ap.add_argument("--variants-T", type=int, nargs="*", default=[8192, 32768], help="T values to time variants at")
    args = ap.parse_args()
    tune = json.loads(args.tune) if args.tune else {}
    with launch_settings(**{op: tune for op in DELTA_OPS}):
        run(args)


def run(args):
    import importlib.metadata as md

    versions = {"torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version()}
    try:
        versions["fla-core"] = md.version("fla-core")
    except md.PackageNotFoundError:
        versions["fla-core"] = None
    record = {
        "what": "Triton delta rule / GDN (this repo) vs FLA 0.6.0 chunk kernels and causal SDPA; "
        "median ms (triton.testing.do_bench); bf16, B*T=%d, H=%d, K=V=%d" % (args.tokens, args.H, args.D),
        "device": torch.cuda.get_device_name(), "versions": versions,
        "tuning": settings_in_effect(["gated_delta_rule"])["gated_delta_rule"],
        "date": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": [],
    }
    for T in args.T:
        B = max(1, args.tokens // T)
        q, k, v, g, beta, do = make_inputs(B, T, args.H, args.D)
        scale = args.D**-0.5
        cands = candidates(q, k, v, g, beta, scale, tuple(args.skip))
        row = {"B": B, "T": T, "H": args.H, "D": args.D, "times": {}}
        for name, (fwd, leaves) in cands.items():
            row["times"][name] = time_one(fwd, leaves, do)
            print(T, name, row["times"][name], flush=True)
        t = row["times"]
        ratios = {}
        for ours, theirs in (("ours_deltanet", "fla_deltanet"), ("ours_gdn", "fla_gdn")):
            for key in ("fwd_ms", "fwdbwd_ms"):
                if key in t.get(ours, {}) and key in t.get(theirs, {}):
                    ratios[f"{ours}/{theirs}:{key}"] = t[ours][key] / t[theirs][key]
                sd = [t[s][key] for s in ("sdpa_cudnn", "sdpa_flash") if key in t.get(s, {})]
                if key in t.get(ours, {}) and sd:
                    ratios[f"{ours}/sdpa_best:{key}"] = t[ours][key] / min(sd)
        row["ratios"] = ratios
        row["cross_check"] = cross_check(cands, do)
        row["kernels_ms"] = kernel_breakdown(q, k, v, g, beta, do, scale)
        variants = json.loads(args.variants) if args.variants and T in args.variants_T else []
        o_default = cands["ours_gdn"][0]().detach() if variants else None
        for over in variants:
            with launch_settings(**{op: over for op in DELTA_OPS}):
                # how far the variant moves the output (e.g. a tf32 solve against the fp32 one)
                o_vs_default = rel_diff(cands["ours_gdn"][0]().detach(), o_default)
                row.setdefault("variants", []).append(
                    {"tuning": over, "o_vs_default": o_vs_default,
                     "kernels_ms": kernel_breakdown(q, k, v, g, beta, do, scale)})
            print(T, "variant", row["variants"][-1], flush=True)
        print(T, "ratios", ratios, "\n   check", row["cross_check"], "\n   kernels", row["kernels_ms"], flush=True)
        record["rows"].append(row)
        del cands, q, k, v, g, beta, do
        torch.cuda.empty_cache()
        save_record(record, args.out)


if __name__ == "__main__":
    main()
