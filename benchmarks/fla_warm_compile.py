"""Compile FLA's autotuned kernels in parallel before the kernels task times FLA.

FLA 0.6.0's chunk_gla autotunes a few hundred Triton configurations on its first call and
compiles each one in turn: on the H200 device that outlasted a 10-minute call (three tries);
chunk_simple_gla's first calls at both head dims take a cold same-process sweep on an H100
past 330 s.
Compiling is CPU work and Triton caches every compiled kernel on disk (TRITON_CACHE_DIR), so
this script starts N worker processes; worker i keeps every N-th configuration of each FLA
autotuner (from the i-th on) and runs the op forward and backward once at the kernels task's gpu
shape, which compiles its share into the shared cache. The kernels task that follows then
autotunes over ALL of FLA's configurations as usual, benchmarking each on an idle GPU, and
finds them compiled: FLA's choice of configuration is unchanged, only the wait is shorter.

    TRITON_CACHE_DIR=$PWD/.triton_cache python benchmarks/fla_warm_compile.py --op gla_vector --procs 14
    TRITON_CACHE_DIR=$PWD/.triton_cache python benchmarks/fla_warm_compile.py --op gdn --heads 16x128,32x64

Comparison tooling only (FLA is never a dependency of the harness).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def shard_autotuners(modules, index: int, count: int) -> int:
    """Keep configurations index, index + count, ... of every triton Autotuner found as an
    attribute of `modules` (at least one each, so every kernel still compiles). Returns how
    many configurations this shard kept in all."""
    from triton.runtime.autotuner import Autotuner

    if not 0 <= index < count:
        raise ValueError(f"shard index {index} is not in [0, {count})")
    kept, seen = 0, set()
    for module in modules:
        for name in dir(module):
            tuner = getattr(module, name)
            if not isinstance(tuner, Autotuner) or id(tuner) in seen:
                continue
            seen.add(id(tuner))
            configs = list(tuner.configs)
            share = configs[index::count] or ([configs[index % len(configs)]] if configs else [])
            tuner.configs = share
            kept += len(share)
    return kept


def fla_modules() -> list:
    """Every FLA module loaded so far (after importing an op: the modules of its kernels)."""
    return [module for name, module in list(sys.modules.items()) if name == "fla" or name.startswith("fla.")]


# --op -> (op, input variant): FLA's kernel and the inputs come from the op's spec.
OPS = {"gla_vector": ("gated_linear_attention", "vector"), "gla_scalar": ("gated_linear_attention", "scalar"),
       "linear": ("linear_attention", "default"), "deltanet": ("delta_rule", "default"),
       "gdn": ("gated_delta_rule", "default"), "mesa": ("mesa", "default")}
# the kernels task's gpu preset: (heads, head dim) at B·T = 65,536, bf16; a head dim is a
# constexpr of FLA's kernels, so each compiles apart
HEADS = {"16x128": (16, 128), "32x64": (32, 64)}


def worker(op: str, T: int, heads: list[str], index: int, count: int) -> None:
    import torch

    from kernels.common.spec import load_entry
    from kernels.registry import SPECS

    name, variant = OPS[op]
    spec = SPECS[name]
    fla = spec.fla_kernel(variant)
    kernel = load_entry(fla.entry)  # imports the op, and with it the modules of its kernels
    kept = shard_autotuners(fla_modules(), index, count)
    started = time.time()
    for label in heads:
        H, D = HEADS[label]
        args = spec.make_inputs(max(1, 65536 // T), T, H, D, D, variant=variant, dtype=torch.bfloat16,
                                device=torch.device("cuda"), seed=0)
        wrt = [t.requires_grad_(True) for t in args.values() if isinstance(t, torch.Tensor) and t.is_floating_point()]
        o = fla.call(kernel, args)
        try:
            torch.autograd.grad(o, wrt, torch.randn_like(o))
        except RuntimeError as e:  # FLA refuses some backwards on this Triton: its forward is compiled
            print(f"shard {index} ({label}): backward raised {type(e).__name__}: {str(e)[:120]}", flush=True)
        torch.cuda.synchronize()
        del o, wrt, args  # one head shape's tensors at a time (processes_for counts on it)
        torch.cuda.empty_cache()
    print(f"shard {index}/{count}: {kept} configurations compiled for {', '.join(heads)} in "
          f"{time.time() - started:.0f} s", flush=True)


def processes_for(requested: int, gpu_gib: float, gib_per_proc: float) -> int:
    """How many worker processes run at once: `requested`, cut to one per gib_per_proc GiB of
    the GPU's memory (each worker holds one op's inputs, intermediates and gradients at the
    gpu shape and what FLA's autotuner allocates while it benchmarks, several GiB: on an
    H100's 80 GB fourteen GDN workers ran out of memory, and nine at 16 x 128 too, in
    chunk_bwd_kernel_dqkwg's autotuning), at least one."""
    if requested < 1 or gib_per_proc <= 0:
        raise ValueError(f"processes_for: requested {requested} must be >= 1 and gib_per_proc "
                         f"{gib_per_proc} > 0")
    return max(1, min(requested, int(gpu_gib // gib_per_proc)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--op", default="gla_vector", choices=sorted(OPS))
    ap.add_argument("--T", type=int, default=2048, help="sequence length of the warm-up call (the "
                    "autotuning keys of these kernels do not depend on it)")
    ap.add_argument("--heads", default="16x128", help="comma-separated head shapes among "
                    f"{sorted(HEADS)} (heads x head dim)")
    ap.add_argument("--procs", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    ap.add_argument("--gib-per-proc", type=float, default=12.0, help="GPU memory a worker may hold (GiB): "
                    "--procs is cut to the GPU's memory over this")
    ap.add_argument("--shard", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not os.environ.get("TRITON_CACHE_DIR"):
        sys.exit("fla_warm_compile: set TRITON_CACHE_DIR to the cache the kernels task will use")
    heads = [h for h in args.heads.split(",") if h]
    unknown = [h for h in heads if h not in HEADS]
    if unknown or not heads:
        sys.exit(f"fla_warm_compile: --heads {args.heads!r}: each must be one of {sorted(HEADS)}")
    if args.shard is not None:
        worker(args.op, args.T, heads, args.shard, args.procs)
        return
    import torch

    if not torch.cuda.is_available():
        sys.exit("fla_warm_compile: no CUDA GPU here; it compiles FLA's kernels on the GPU the kernels task will time")
    gpu_gib = torch.cuda.get_device_properties(0).total_memory / 2**30
    procs = processes_for(args.procs, gpu_gib, args.gib_per_proc)
    if procs < args.procs:
        print(f"fla_warm_compile: --procs {args.procs} cut to {procs}: {gpu_gib:.0f} GiB of GPU memory at "
              f"{args.gib_per_proc:g} GiB a worker", flush=True)
    args.procs = procs
    started = time.time()
    # a shard's autotuning result covers its share of the configurations only: never cached
    # (Triton keys that cache by the configuration list too; this makes sure)
    env = {**os.environ, "TRITON_CACHE_AUTOTUNING": "0"}
    procs = [subprocess.Popen([sys.executable, __file__, "--op", args.op, "--T", str(args.T), "--heads", args.heads,
                               "--procs", str(args.procs), "--shard", str(i)], env=env)
             for i in range(args.procs)]
    try:
        failed = [i for i, p in enumerate(procs) if p.wait() != 0]
    except KeyboardInterrupt:  # a stage limit (timeout -s INT): stop the workers too
        for p in procs:
            p.terminate()
        raise
    print(f"fla_warm_compile: {args.op}, {args.procs} processes, {time.time() - started:.0f} s"
          + (f"; shards {failed} failed" if failed else ""), flush=True)


if __name__ == "__main__":
    main()
