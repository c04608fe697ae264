"""The MesaNet state passes (kernels/mesa/triton_states.py) under launch variants: a section of
bench_mesa.py (--states-variants).

Per T: the median ms of both forward state passes (H_kk and H_kv) and both backward ones
for each variant of StateLaunch's TUNING keys (states_BK, states_BD, states_min_BD,
states_min_programs, state_warps, states_stages), with each variant's states and gradients
checked against the first variant's (the same sums in the same order per block, so they
agree to rounding). The correct variant with the least total time over every T is "best".
"""

from __future__ import annotations

import torch
from triton.testing import do_bench

from benchmarks.timing import rel_diff
from kernels.mesa import triton_function as tf
from kernels.mesa.triton_states import StateLaunch, mesa_bwd_states, mesa_fwd_states

CHUNK = 64


def _passes(k, v, g, beta, q_star, y, do, launch):
    """The forward pair and the backward pair as zero-argument callables, and the forward
    pair's outputs (the backward's input states)."""
    def fwd():
        return (mesa_fwd_states(k, k, g, beta, None, False, CHUNK, "tf32", launch),
                mesa_fwd_states(k, v, g, beta, None, False, CHUNK, "tf32", launch))

    fwd_out = fwd()
    h_kk, h_kv = (pair[0] for pair in fwd_out)

    def bwd():
        return (mesa_bwd_states(y, q_star, g, h_kk, None, -1.0, False, CHUNK, "tf32", launch),
                mesa_bwd_states(q_star, do, g, h_kv, None, 1.0, False, CHUNK, "tf32", launch))

    return fwd, bwd, fwd_out


def states_sweep(make_inputs, Ts, H, D, tokens, variants):
    """Records per variant ({"T": {T: {fwd_states_x2_ms, bwd_states_x2_ms, ...}}}) and the
    best variant's TUNING overrides (None when no variant passed the check).
    make_inputs(B, T, H, D) -> ([q, k, v, g, beta, lamb], do) as bench_mesa's."""
    out = [{"variant": dict(over), "T": {}} for over in variants]
    for T in Ts:
        leaves, do = make_inputs(max(1, tokens // T), T, H, D)
        q, k, v, g, beta, _ = leaves
        # stand-ins for q* and the adjoint y: the passes' cost does not depend on their values
        q_star, y = q.float(), (k.float() * 0.5)
        first = None
        for rec, over in zip(out, variants):
            try:
                launch = StateLaunch.from_tuning({**tf.TUNING, **over})
                fwd, bwd, fwd_out = _passes(k, v, g, beta, q_star, y, do, launch)
                got = [t for out in (fwd_out, bwd()) for pair in out for t in pair if t is not None]
                first = first or got
                row = {"max_rel_diff_vs_first": max(rel_diff(a, b) for a, b in zip(got, first)),
                       "fwd_states_x2_ms": do_bench(fwd, warmup=5, rep=30, return_mode="median"),
                       "bwd_states_x2_ms": do_bench(bwd, warmup=5, rep=30, return_mode="median")}
            except Exception as e:  # noqa: BLE001 - a variant that fails to compile or run is recorded
                row = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            rec["T"][T] = row
            print("states", T, over, row, flush=True)
        del leaves, do, q_star, y
        torch.cuda.empty_cache()
    ok = [r for r in out if all("error" not in t and t["max_rel_diff_vs_first"] < 1e-4 for t in r["T"].values())]
    if not ok:
        return out, None
    best = min(ok, key=lambda r: sum(t["fwd_states_x2_ms"] + t["bwd_states_x2_ms"] for t in r["T"].values()))
    return out, best["variant"]
