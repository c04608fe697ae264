"""Timing, comparison and record helpers shared by the kernel benchmarks (CUDA only).

    time_fwd_fwdbwd(fwd, leaves, cotangents)  fwd and fwd+bwd medians, peak extra memory
    rel_diff(a, b)                             ||a - b|| / ||b|| in fp64
    save_record(record, path)                  the JSON at path, and a copy in $OUT

Medians come from triton.testing.do_bench after its warm-up; a measurement that raises is
recorded in the row (FLA refuses some backwards on Triton 3.6) and the benchmark goes on.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence

import torch


def save_record(record: dict, path: str) -> None:
    """Write `record` as JSON to `path` and, on a device machine (OUT set), a copy to
    $OUT/<same name>; benchmarks call it after every measurement so a cut run keeps them."""
    paths = [path] + ([os.path.join(os.environ["OUT"], os.path.basename(path))] if os.environ.get("OUT") else [])
    for target in dict.fromkeys(paths):
        os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
        tmp = f"{target}.tmp"  # renamed into place: a reader never sees half a record
        with open(tmp, "w") as f:
            json.dump(record, f, indent=1)
            f.write("\n")
        os.replace(tmp, target)


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative difference ||a - b|| / ||b|| (fp64; 0 / 0 counts as 0)."""
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def time_fwd_fwdbwd(
    fwd: Callable[[], torch.Tensor | Sequence[torch.Tensor]],
    leaves: Sequence[torch.Tensor],
    cotangents: Sequence[torch.Tensor] | torch.Tensor | Callable | None = None,
    warmup: int = 25,
    rep: int = 100,
    time_forward: bool = True,
) -> dict:
    """{"fwd_ms", "peak_extra_MiB", "fwdbwd_ms"} of `fwd` (returning one output or a tuple)
    and of fwd + the gradients of `leaves` (requires_grad is set here) against `cotangents`:
    one per output, a callable from the outputs to them, or None (fixed random ones made
    before timing). time_forward=False leaves fwd_ms out (a caller timing its forward
    otherwise, e.g. without autograd). A step that raises leaves "fwd_error" or "bwd_error"
    instead of its figures."""
    from triton.testing import do_bench

    for x in leaves:
        x.requires_grad_(True)
    row: dict = {}
    try:
        outs = fwd()
        outs = (outs,) if isinstance(outs, torch.Tensor) else tuple(outs)
        if cotangents is None:
            cots = tuple(torch.randn_like(o) for o in outs)
        else:
            cots = cotangents(outs) if callable(cotangents) else cotangents
            cots = (cots,) if isinstance(cots, torch.Tensor) else tuple(cots)
        del outs
        if time_forward:
            row["fwd_ms"] = do_bench(fwd, warmup=warmup, rep=rep, return_mode="median")
    except Exception as exc:  # noqa: BLE001 - recorded, the other measurements still run
        row["fwd_error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
        return row

    def fwd_bwd():
        outs = fwd()
        outs = (outs,) if isinstance(outs, torch.Tensor) else tuple(outs)
        return torch.autograd.grad(outs, list(leaves), cots)

    try:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fwd_bwd()
        torch.cuda.synchronize()
        row["peak_extra_MiB"] = (torch.cuda.max_memory_allocated() - base) / 2**20
        row["fwdbwd_ms"] = do_bench(fwd_bwd, warmup=warmup, rep=rep, return_mode="median")
    except Exception as exc:  # noqa: BLE001 - recorded (e.g. FLA's refused backward)
        row["bwd_error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
    return row
