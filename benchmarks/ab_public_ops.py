"""Before/after timing of two source trees' Triton kernels through the public ops, one tree per
process (both name their package `kernels`), on identical seeded inputs.

    python benchmarks/ab_public_ops.py --tree .abtree --label before --out ab.jsonl [--round 1]

Appends one JSON line per point to --out: label, tree commit, op, variant, T, phase, the first
call's seconds (the Triton compile when the cache is cold) and the median ms of the tasks'
one timer (tasks/common/timing.py: L2 flushed before each call, calls queued, one wait).
benchmarks/h200_kernels.sh (AB_S) runs the trees' processes in turn, round after round, so
drift on the machine falls on both; `--summarize` folds the lines into medians per point and
the after/before ratio.

Only for comparing trees: kernel timings of one tree are run records of the kernels task.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

# op, variant, T values; B·T = 65,536, H = 16, K = V = 128, bf16, as the kernels task's gpu preset
POINTS = [
    ("linear_attention", "default", (2048, 8192)),
    ("gated_linear_attention", "scalar", (2048, 8192)),
    ("gated_linear_attention", "vector", (2048,)),
    ("delta_rule", "default", (2048, 8192)),
    ("gated_delta_rule", "default", (2048, 8192)),
    ("linearized_softmax_gdn", "default", (2048,)),
    ("mesa", "default", (2048,)),
]
TOKENS, H, D = 65536, 16, 128
DEVICE, DTYPE = "cuda", "bfloat16"


def inputs(op: str, variant: str, T: int, torch):
    """Seeded inputs of one point: l2-normalised k, mild gates (about -0.02 a token), beta in (0, 1)."""
    gen = torch.Generator(device=DEVICE).manual_seed(T)
    B = TOKENS // T

    def randn(*shape):
        return torch.randn(*shape, device=DEVICE, generator=gen)

    q = randn(B, T, H, D).to(getattr(torch, DTYPE))
    k = torch.nn.functional.normalize(randn(B, T, H, D), dim=-1).to(getattr(torch, DTYPE))
    v = randn(B, T, H, D).to(getattr(torch, DTYPE))
    args = {"q": q, "k": k, "v": v}
    if op in ("gated_linear_attention", "gated_delta_rule", "mesa"):
        shape = (B, T, H, D) if variant == "vector" else (B, T, H)
        args["g"] = torch.nn.functional.logsigmoid(randn(*shape) + 4.0)
    if op in ("delta_rule", "gated_delta_rule", "mesa"):
        args["beta"] = torch.sigmoid(randn(B, T, H))
    if op == "mesa":
        args["lamb"] = 0.25 + torch.rand(H, D, device=DEVICE, generator=gen)
    return args


# as the kernels task times a point on CUDA, with a longer warm-up (the first call compiled)
TIMING_OPTIONS = {"warmup": 10, "min_repeats": 10, "max_repeats": 200, "target_ms": 300.0}


def run_tree(args) -> None:
    global TOKENS, H, D, DEVICE, DTYPE
    if args.smoke:  # the code paths on the CPU interpreter at a toy size: no timing
        TOKENS, H, D, DEVICE, DTYPE, args.warm_only = 256, 2, 16, "cpu", "float16", True
    tree = Path(args.tree).resolve()
    # kernels from the tree under test; the timer (which imports no kernels) from this checkout
    sys.path[:0] = [str(tree), str(Path(__file__).resolve().parents[1])]
    import torch

    import kernels
    from tasks.common.timing import TimingOptions, time_callable

    TIMING = TimingOptions(**TIMING_OPTIONS)

    if not Path(kernels.__file__).resolve().is_relative_to(tree):
        raise SystemExit(f"kernels imported from {kernels.__file__}, not from --tree {tree}")
    # An exported tree names its commit in COMMIT; a checkout asks git.
    commit = ((tree / "COMMIT").read_text().strip() if (tree / "COMMIT").exists() else
              subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True).stdout.strip())
    with open(args.out, "a") as out:
        for op, variant, lengths in POINTS:
            fn = getattr(kernels, op)
            for T in (t // 64 for t in lengths) if args.smoke else lengths:
                a = inputs(op, variant, T, torch)
                for phase in ("fwd", "fwdbwd"):
                    wrt = [t.requires_grad_(phase == "fwdbwd") for t in a.values() if t.is_floating_point()]
                    wrt = [t for t in wrt if t.requires_grad]

                    def call(a=a, wrt=wrt):
                        o = fn(**a, backend="triton", check_values=False)[0]
                        if wrt:
                            torch.autograd.grad(o, wrt, o, allow_unused=True)
                        return o

                    row = {"label": args.label, "commit": commit, "round": args.round, "op": op,
                           "variant": variant, "T": T, "B": TOKENS // T, "H": H, "K": D, "V": D, "dtype": DTYPE,
                           "phase": phase}
                    try:
                        t0 = time.perf_counter()
                        call()
                        if DEVICE == "cuda":
                            torch.cuda.synchronize()
                        row["first_call_s"] = time.perf_counter() - t0
                        if not args.warm_only:
                            row["ms"] = time_callable(call, DEVICE, TIMING).median_ms
                        row["status"] = "ok"
                    except Exception as e:  # recorded, and the next point goes on
                        row["status"], row["error"] = "failed", f"{type(e).__name__}: {e}"[:300]
                    print(json.dumps(row), flush=True)
                    out.write(json.dumps(row) + "\n")
                    out.flush()
                del a
                if DEVICE == "cuda":
                    torch.cuda.empty_cache()


def summarize(path: str, before: str, after: str) -> dict:
    rows = [json.loads(line) for line in open(path) if line.strip()]
    points: dict[tuple, dict[str, list[float]]] = {}
    compile_s: dict[tuple, dict[str, float]] = {}
    for r in rows:
        key = (r["op"], r["variant"], r["T"], r["phase"])
        if r["status"] == "ok" and "ms" in r:
            points.setdefault(key, {}).setdefault(r["label"], []).append(r["ms"])
        if r["status"] == "ok" and r.get("round") == 0:
            compile_s.setdefault(key, {})[r["label"]] = r["first_call_s"]
    table = []
    for key, by_label in sorted(points.items()):
        row = dict(zip(("op", "variant", "T", "phase"), key))
        for label in (before, after):
            if label in by_label:
                row[f"{label}_ms"] = statistics.median(by_label[label])
                row[f"{label}_rounds"] = len(by_label[label])
        if f"{before}_ms" in row and f"{after}_ms" in row:
            row["ratio"] = row[f"{after}_ms"] / row[f"{before}_ms"]
        row.update({f"{label}_first_call_s": s for label, s in compile_s.get(key, {}).items()})
        table.append(row)
    failed = [r for r in rows if r["status"] != "ok"]
    return {"points": table, "failed": failed, "commits": sorted({(r["label"], r["commit"]) for r in rows})}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", help="source tree whose kernels/ to time")
    p.add_argument("--label", help="name of the tree in the output (e.g. before, after)")
    p.add_argument("--out", required=True, help="JSON-lines file to append to (or read, with --summarize)")
    p.add_argument("--round", type=int, default=0, help="round number (0: the first, cold-cache pass)")
    p.add_argument("--warm-only", action="store_true", help="only the first call of each point (compile)")
    p.add_argument("--smoke", action="store_true", help="toy sizes on the CPU (TRITON_INTERPRET=1), no timing")
    p.add_argument("--summarize", nargs=2, metavar=("BEFORE", "AFTER"), help="fold --out into medians")
    args = p.parse_args()
    if args.summarize:
        print(json.dumps(summarize(args.out, *args.summarize), indent=1))
        return
    if not (args.tree and args.label):
        p.error("--tree and --label are needed to time a tree")
    run_tree(args)


if __name__ == "__main__":
    main()
