"""The MesaNet state passes (kernels/mesa/triton_states.py) under launch variants: a section of
bench_mesa.py (--states-variants).

Per T: the median ms of both forward state passes (H_kk and H_kv) and both backward ones
for each variant of the state passes' settings (flat keys states_BK, states_BD, states_min_BD,
states_min_programs, state_warps, states_stages: mesa_changes), with each variant's states and gradients
checked against the first variant's (the same sums in the same order per block, so they
agree to rounding). The correct variant with the least total time over every T is "best".
"""

from __future__ import annotations

import torch
from triton.testing import do_bench

from benchmarks.timing import rel_diff
from kernels.common.launch import settings, with_changes
from kernels.mesa.triton_states import mesa_bwd_states, mesa_fwd_states

CHUNK = 64

# the benchmarks' flat names of MesaLaunch settings (kernels/common/launch.py): field paths
# ("both": fwd_solve and bwd_solve alike)
FLAT_KEYS = {
    "prec": ("prec",), "cg_prec": ("cg_prec",),
    "rows": ("both", "rows"), "bwd_rows": ("bwd_solve", "rows"), "solve_warps": ("both", "num_warps"),
    "weights_scan": ("both", "weights_scan"), "diag_prec": ("both", "diag_cg_prec"),
    "cg_operands": ("both", "operands"),
    "states_BK": ("states", "max_BK"), "states_BD": ("states", "max_BD"), "states_min_BD": ("states", "min_BD"),
    "states_min_programs": ("states", "min_programs"), "state_warps": ("states", "num_warps"),
    "states_stages": ("states", "num_stages"), "grads_warps": ("grads", "num_warps"),
}


def mesa_changes(flat) -> dict:
    """MesaLaunch changes (for launch_settings(mesa=...)) from a flat variant such as
    {"rows": 32, "cg_operands": "fp32"}: rows sets both solves' rows unless bwd_rows is
    given, diag_prec "cg" is diag_cg_prec on. Unknown keys raise ValueError."""
    changes: dict = {}
    for key, value in (flat or {}).items():
        if key not in FLAT_KEYS:
            raise ValueError(f"unknown mesa setting {key!r}; known: {sorted(FLAT_KEYS)}")
        if key == "diag_prec":
            value = value == "cg"
        path = FLAT_KEYS[key]
        if len(path) == 1:
            changes[path[0]] = value
            continue
        for part in ("fwd_solve", "bwd_solve") if path[0] == "both" else (path[0],):
            if key == "rows" and part == "bwd_solve" and "bwd_rows" in flat:
                continue
            changes.setdefault(part, {})[path[1]] = value
    return changes


def flat_settings() -> dict:
    """The mesa settings in effect under the flat names of FLAT_KEYS."""
    cur = settings("mesa")
    out = {}
    for key, path in FLAT_KEYS.items():
        obj = cur.fwd_solve if path[0] == "both" else cur
        for part in path if path[0] != "both" else path[1:]:
            obj = getattr(obj, part)
        out[key] = ("cg" if obj else "ieee") if key == "diag_prec" else obj
    return out


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
    best variant's flat settings (mesa_changes; None when no variant passed the check).
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
                launch = with_changes(settings("mesa"), mesa_changes(over)).states
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
