"""Speed of the Triton linearized softmax GDN (docs/design.md §7) against the bare Triton GDN it runs on.

    PYTHONPATH=. python benchmarks/bench_lin_gdn.py --out results/bench/h200_lin_gdn.json

Shapes: B*T = 65,536 tokens, H = 16, K = V = 128, bf16, T in {2048, 8192, 32768}; the same
q, k (l2-normalised), v feed both ops; the GDN also gets g = logsigmoid(N(4, 1)) and
beta = sigmoid(N(0, 1)). For each T, median ms (triton.testing.do_bench) of fwd and fwd+bwd
(gradients of q, k, v) of
    lin_gdn      linearized_softmax_gdn(backend="triton")
    gdn          gated_delta_rule(backend="triton")
    prep_triton  the running-mean preprocessing alone (LinGDNPrepFunction)
    prep_torch   the same formulas in torch (running_mean_torch, fp32: the former path)
with the peak extra memory of each fwd+bwd, the ratios lin_gdn / gdn and prep / lin_gdn, and
prep_triton against prep_torch (relative errors of the outputs). --variants times the
preprocessing under other launch settings (PrepLaunch changes, kernels/common/launch.py). The JSON is rewritten after
every T, so a run cut short keeps what it measured. Needs CUDA; imports nothing CUDA-specific
at import time.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_delta import make_inputs  # the same inputs as the GDN benchmark
from benchmarks.timing import rel_diff, save_record, time_fwd_fwdbwd


def candidates(q, k, v, g, beta):
    """name -> (forward returning a tuple of the outputs to differentiate, the leaves)."""
    from kernels.gated_delta_rule import gated_delta_rule
    from kernels.linearized_softmax_gdn import linearized_softmax_gdn
    from kernels.linearized_softmax_gdn.triton_prep import (
        LinGDNPrepFunction,
        PrepOptions,
        running_mean_torch,
    )

    def prep_triton():
        return LinGDNPrepFunction.apply(k, v, None, None, PrepOptions(count=0))[:3]

    def prep_torch():
        return running_mean_torch(k, v, None, None, 0, torch.float32, k.dtype)[:3]

    return {
        "lin_gdn": (lambda: (linearized_softmax_gdn(q, k, v, backend="triton")[0],), (q, k, v)),
        "gdn": (lambda: (gated_delta_rule(q, k, v, g, beta, backend="triton")[0],), (q, k, v)),
        "prep_triton": (prep_triton, (k, v)),
        "prep_torch": (prep_torch, (k, v)),
    }


def prep_check(cands):
    """prep_triton against prep_torch (fp32 sums both): outputs and gradients of k, v."""
    (f1, leaves), (f2, _) = cands["prep_triton"], cands["prep_torch"]
    o1, o2 = f1(), f2()
    res = {n: rel_diff(a, b) for n, a, b in zip(("key", "value", "v_bar"), o1, o2)}
    cots = [torch.randn_like(o.float()).to(o.dtype) for o in o1]
    for n, a, b in zip(("dk", "dv"), torch.autograd.grad(o1, leaves, cots), torch.autograd.grad(o2, leaves, cots)):
        res[n] = rel_diff(a, b)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results/bench/h200_lin_gdn.json")
    ap.add_argument("--tokens", type=int, default=65536)
    ap.add_argument("--T", type=int, nargs="+", default=[2048, 8192, 32768])
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--tune", default="", help='JSON PrepLaunch changes (kernels/common/launch.py) for the '
                    'whole run, e.g. {"tile_elems": 8192}')
    ap.add_argument("--variants", default="", help="JSON list of PrepLaunch changes; prep_triton timed under each")
    args = ap.parse_args()

    from kernels.common.launch import launch_settings

    with launch_settings(linearized_softmax_gdn={"prep": json.loads(args.tune) if args.tune else {}}):
        run(args)


def run(args):
    import triton

    from kernels.common.launch import launch_settings
    from kernels.linearized_softmax_gdn import triton_prep

    record = {
        "what": "Triton linearized softmax GDN vs the Triton GDN it runs on, and its preprocessing alone; "
        f"median ms (triton.testing.do_bench); bf16, B*T={args.tokens}, H={args.H}, K=V={args.D}",
        "device": torch.cuda.get_device_name(),
        "versions": {"torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version()},
        "prep_tuning": dataclasses.asdict(triton_prep.prep_launch()), "date": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": [],
    }
    for T in args.T:
        B = max(1, args.tokens // T)
        q, k, v, g, beta, _ = make_inputs(B, T, args.H, args.D)
        cands = candidates(q, k, v, g, beta)
        row = {"B": B, "T": T, "H": args.H, "D": args.D, "times": {}, "ratios": {}}
        row["blocks_BT_BD"] = triton_prep.launch_blocks(B * args.H, args.D, T, triton_prep.prep_launch())
        for name, (fwd, leaves) in cands.items():
            row["times"][name] = time_fwd_fwdbwd(fwd, leaves)
            print(T, name, row["times"][name], flush=True)
        t = row["times"]
        for key in ("fwd_ms", "fwdbwd_ms"):
            for num, den in (("lin_gdn", "gdn"), ("prep_triton", "lin_gdn"), ("prep_torch", "prep_triton")):
                if key in t[num] and key in t[den]:
                    row["ratios"][f"{num}/{den}:{key}"] = t[num][key] / t[den][key]
        row["prep_triton_vs_torch"] = prep_check(cands)
        for over in json.loads(args.variants) if args.variants else []:
            with launch_settings(linearized_softmax_gdn={"prep": over}):
                row.setdefault("prep_variants", []).append(
                    {"tuning": over, "blocks_BT_BD": triton_prep.launch_blocks(B * args.H, args.D, T, triton_prep.prep_launch()),
                     **time_fwd_fwdbwd(*cands["prep_triton"])})
            print(T, "variant", row["prep_variants"][-1], flush=True)
        print(T, "ratios", row["ratios"], "\n   check", row["prep_triton_vs_torch"], flush=True)
        record["rows"].append(row)
        del cands, q, k, v, g, beta
        torch.cuda.empty_cache()
        save_record(record, args.out)


if __name__ == "__main__":
    main()
