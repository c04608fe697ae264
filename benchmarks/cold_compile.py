"""Cold compile of the Triton kernels one training step of each mixer's op launches, per head dim:
each (op, head dim) in a fresh process with an empty Triton cache, forward and backward once in
bf16 without a state (tests/compile_sm90.training_step: B = 1, T = 200, H = 2, K = V = head
dim), the mixer's gate variant.

    python benchmarks/cold_compile.py --out F.json [--head-dims 64,128] [--jobs 2]

Where a CUDA device is present the step runs for real, and a kernel's seconds are its first
launch's wall time, which is its compile. Without one (TRITON_INTERPRET unset) each launch is
compiled for sm_90 and not run (tests/compile_sm90.py's CompileOnly), with the registers and
spill stack of each kernel from cuobjdump. Either way the record holds, per op and head dim,
the seconds of every distinct kernel launch, their sum, and the machine it ran on.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# mixer -> (op, input variant) of its training step
MIXERS = {
    "linear": ("linear_attention", None),
    "gla": ("gated_linear_attention", "vector"),
    "deltanet": ("delta_rule", None),
    "gdn": ("gated_delta_rule", None),
    "lin_gdn": ("linearized_softmax_gdn", None),
    "mesa": ("mesa", None),
}
def child(op: str, variant: str | None, head_dim: int) -> dict:
    """One op's forward and backward in this (fresh) process; the seconds of each launch."""
    sys.path.insert(0, str(ROOT))
    sys.path.append(str(ROOT / "tests"))  # after ROOT: tests/benchmarks must not shadow benchmarks/
    import torch
    from compile_sm90 import CompileOnly, training_step
    from triton.runtime.jit import JITFunction

    on_gpu = torch.cuda.is_available()
    launches: list[dict] = []
    if on_gpu:
        run = JITFunction.run

        def timed(self, *args, **kwargs):
            torch.cuda.synchronize()
            started = time.perf_counter()
            out = run(self, *args, **kwargs)
            torch.cuda.synchronize()
            launches.append({"kernel": self.__name__, "seconds": time.perf_counter() - started})
            return out

        JITFunction.run = timed
    else:
        stand_in = CompileOnly(resources=True)
        JITFunction.run = lambda self, *args, **kwargs: stand_in(self, *args, **kwargs)
    train = training_step(op, variant, head_dim, "cuda" if on_gpu else "cpu")

    def step() -> float:
        started = time.perf_counter()
        train()
        return time.perf_counter() - started

    wall = step()
    failed = []
    if on_gpu:
        # The same launches again, compiled: a launch's compile is its first time less its second.
        first = launches[:]
        launches.clear()
        warm = step()
        if [x["kernel"] for x in launches] != [x["kernel"] for x in first]:
            raise RuntimeError("the second step launched other kernels than the first")
        launches[:] = [{"kernel": a["kernel"], "seconds": max(0.0, a["seconds"] - b["seconds"])}
                       for a, b in zip(first, launches)]
        wall -= warm
    else:
        for key, seconds in stand_in.done.items():
            launches.append({"kernel": key[0], "constexprs": dict(key[1]), "options": dict(key[3]),
                             "seconds": seconds, "resources": stand_in.usage.get(key)})
        failed = [{"kernel": key[0], "error": err} for key, err in stand_in.failed.items()]
    return {"mode": "device" if on_gpu else "compile-only sm_90", "wall_s": wall, "launches": launches,
            "compile_s": sum(x["seconds"] for x in launches), "failed": failed}


def measure(mixer: str, head_dim: int, timeout_s: float) -> dict:
    op, variant = MIXERS[mixer]
    with tempfile.TemporaryDirectory(prefix="cold-triton-") as cache:
        env = {**os.environ, "TRITON_CACHE_DIR": cache}
        env.pop("TRITON_INTERPRET", None)
        code = (f"import json, sys; sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); import cold_compile; "
                f"print('RESULT', json.dumps(cold_compile.child({op!r}, {variant!r}, {head_dim})))")
        started = time.perf_counter()
        try:
            done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                  timeout=timeout_s, cwd=ROOT)
        except subprocess.TimeoutExpired:
            return {"mixer": mixer, "op": op, "head_dim": head_dim, "status": "timeout",
                    "process_s": time.perf_counter() - started}
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        return {"mixer": mixer, "op": op, "head_dim": head_dim, "status": "failed",
                "error": (done.stderr or done.stdout)[-2000:]}
    result = json.loads(lines[-1].removeprefix("RESULT "))
    return {"mixer": mixer, "op": op, "variant": variant, "head_dim": head_dim, "status": "ok",
            "process_s": time.perf_counter() - started, **result}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, type=Path, help="JSON file to write (rewritten after each result)")
    p.add_argument("--head-dims", default="64,128")
    p.add_argument("--mixers", default=",".join(MIXERS))
    p.add_argument("--jobs", type=int, default=2, help="processes at once (each compiles on one core)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per (mixer, head dim)")
    args = p.parse_args()
    mixers = args.mixers.split(",")
    unknown = [m for m in mixers if m not in MIXERS]
    if unknown:
        p.error(f"--mixers: {unknown} have no Triton op here; valid: {', '.join(MIXERS)}")
    head_dims = [int(d) for d in args.head_dims.split(",")]
    sys.path.insert(0, str(ROOT))
    import torch
    import triton

    from benchmarks.json_record import save_text
    from harness.envinfo import git_commit

    record = {"what": __doc__.split("\n\n")[0], "machine": platform.processor() or platform.machine(),
              "cpu_count": os.cpu_count(), "jobs": args.jobs,
              "device": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
              "torch": torch.__version__, "triton": triton.__version__, "commit": git_commit(),
              "date": time.strftime("%Y-%m-%d"), "results": []}
    jobs = [(m, d) for m in mixers for d in head_dims]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for result in pool.map(lambda job: measure(*job, args.timeout), jobs):
            record["results"].append(result)
            print(f"{result['mixer']:9s} K={result['head_dim']:4d} {result['status']:8s} "
                  f"compile {result.get('compile_s', float('nan')):7.1f} s "
                  f"({len(result.get('launches', []))} kernels)", flush=True)
            save_text(json.dumps(record, indent=1), args.out)


if __name__ == "__main__":
    main()
