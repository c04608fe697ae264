"""MesaNet's Triton backend on a CUDA GPU (docs/design.md §8, §9).

Every case against the exact per-token reference (kernels/mesa/reference.py: a
torch.linalg.solve of every token's system) in fp64 on the same GPU, on the inputs the
kernels get: so the cases check that cg_steps of CG converge, not only that the kernels
run CG as the chunked PyTorch form does. bf16 at T = 32k, 8192, 2100 and 300 with
K = V = 128 and at T = 2100 with K = V = 64, fp32 at awkward K, V (above and below 64) with
a CG tolerance; the CG operand forms other than the
default (MesaLaunch's SolveLaunch.operands) on cases of their own. The op runs through the public
`mesa(backend="triton")`, and each case asserts that its Triton entry point ran. Each
output and each gradient (q, k, v, g, beta, lamb, both initial states) is its own test
item, held to TOL (whole tensor) and ROW_TOL (worst row, tests/util.py); a bf16 worst row
over ROW_TOL passes only where the case's fp16 twin (fp16 q, k, v, and the 16-bit path's own
precisions raised to fp32) shows it to be rounding (tests/util.py rounding_verdict), as in
the delta rules' and the NaN cases' GPU tests. Every buffer the kernels write starts as NaN.

The reference is a Python loop over tokens whose autograd keeps 1.6 MB of fp64 per token at
K = V = 128 and B * H = 2 (measured on the CPU): 52 GB at T = 32768, which an H200 holds.

Skipped without CUDA, and in a session where TRITON_INTERPRET is set (run tests/gpu in a
pytest session of its own). Errors are printed (-s) and, when GPU_ERRORS_JSON names a file,
written there.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from tests.gpu.backends import triton_ran
from tests.util import GPU_ONLY, ROW_TOL, TOL, record_gpu_errors, rel_err, rounding_verdict, row_err

pytestmark = GPU_ONLY

pytest.importorskip("triton")

DEVICE = "cuda"

# name: (B, T, H, K, V, dtype, gates, options); every case against the exact fp64 reference
CASES = {
    "bf16_T32768_vs_exact": (1, 32768, 2, 128, 128, torch.bfloat16, "near0", {"cg_steps": 30}),
    "bf16_T300_vs_exact": (1, 300, 2, 128, 128, torch.bfloat16, "near0", {"cg_steps": 30}),
    "bf16_T2100_strong_vs_exact": (2, 2100, 2, 128, 128, torch.bfloat16, "strong", {"cg_steps": 30}),
    "fp32_T300_K100_V60_tol_vs_exact": (
        2, 300, 3, 100, 60, torch.float32, "near0", {"cg_steps": 100, "cg_tol": 1e-7}),
    # head dims up to 64: the CG programs' narrow warps (SolveLaunch.warps_for)
    "bf16_T2100_K64_strong_vs_exact": (2, 2100, 2, 64, 64, torch.bfloat16, "strong", {"cg_steps": 30}),
    "fp32_T300_K48_V40_tol_vs_exact": (
        2, 300, 3, 48, 40, torch.float32, "near0", {"cg_steps": 100, "cg_tol": 1e-7}),
    # each CG operand form (SolveLaunch.operands, both solves) named, whatever the default
    "bf16_T8192_fp16_normed_vs_exact": (
        1, 8192, 2, 128, 128, torch.bfloat16, "near0", {"cg_steps": 30, "tuning": {"cg_operands": "fp16_normed"}}),
    "bf16_T2100_strong_fp16_normed_vs_exact": (
        2, 2100, 2, 128, 128, torch.bfloat16, "strong", {"cg_steps": 30, "tuning": {"cg_operands": "fp16_normed"}}),
    "bf16_T8192_fp16_scaled_vs_exact": (
        1, 8192, 2, 128, 128, torch.bfloat16, "near0", {"cg_steps": 30, "tuning": {"cg_operands": "fp16_scaled"}}),
    "bf16_T8192_fp32_operands_vs_exact": (
        1, 8192, 2, 128, 128, torch.bfloat16, "near0", {"cg_steps": 30, "tuning": {"cg_operands": "fp32"}}),
}
# cases compared with a CASES entry rather than held to the bounds: the K = 64 case with its
# CG programs at the wide programs' 8 warps or at 32 rows a program, and the strong-gate cases
# with the gradient kernel at 8 warps over the whole K ("grads": GradsLaunch fields; the
# default is 4 warps over 32-column key blocks)
GRADS_8W_WHOLE_K = {"num_warps": 8, "BC": 256}
PAIRED = {
    "bf16_T2100_K64_strong_8warps": (
        2, 2100, 2, 64, 64, torch.bfloat16, "strong", {"cg_steps": 30, "tuning": {"narrow_num_warps": 8}}),
    "bf16_T2100_K64_strong_rows32": (
        2, 2100, 2, 64, 64, torch.bfloat16, "strong", {"cg_steps": 30, "tuning": {"narrow_rows": 32}}),
    "bf16_T2100_K64_strong_grads_8w_whole_k": (
        2, 2100, 2, 64, 64, torch.bfloat16, "strong", {"cg_steps": 30, "grads": GRADS_8W_WHOLE_K}),
    "bf16_T2100_strong_grads_8w_whole_k": (
        2, 2100, 2, 128, 128, torch.bfloat16, "strong", {"cg_steps": 30, "grads": GRADS_8W_WHOLE_K}),
}
QUANTITIES = ("o", "h_kk", "h_kv", "dq", "dk", "dv", "dg", "dbeta", "dlamb", "dh_kk0", "dh_kv0")


def make_inputs(B, T, H, K, V, gates, seed=0):
    """Leaves as a MesaNet layer makes them: unit q, k; beta = sigmoid; lamb = softplus + 0.25;
    a symmetric PSD h_kk0 and a random h_kv0 (all fp32; q, k, v cast by the caller)."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    dev = DEVICE
    q = F.normalize(torch.randn(B, T, H, K, device=dev, generator=gen), dim=-1)
    k = F.normalize(torch.randn(B, T, H, K, device=dev, generator=gen), dim=-1)
    v = torch.randn(B, T, H, V, device=dev, generator=gen)
    if gates == "near0":
        g = F.logsigmoid(torch.randn(B, T, H, device=dev, generator=gen) + 4.0)
    else:
        g = -6.0 * torch.rand(B, T, H, device=dev, generator=gen)
    beta = torch.sigmoid(torch.randn(B, T, H, device=dev, generator=gen))
    lamb = F.softplus(torch.rand(H, K, device=dev, generator=gen)) + 0.25
    a = torch.randn(B, H, K, K, device=dev, generator=gen) / K
    h_kk0 = a @ a.transpose(-1, -2)
    h_kv0 = 0.1 * torch.randn(B, H, K, V, device=dev, generator=gen)
    return [q, k, v, g, beta, lamb, h_kk0, h_kv0]


def _outputs_and_grads(fn, leaves, cotangents=None):
    """(o, h_kk_T, h_kv_T) and the gradient of every leaf; cotangents default to seeded
    random ones in each output's dtype, which the caller reuses (cast) for the reference."""
    o, final = fn(leaves)
    outs = (o, final.h_kk, final.h_kv)
    if cotangents is None:
        gen = torch.Generator(device=DEVICE).manual_seed(1234)
        cotangents = [torch.randn(t.shape, device=DEVICE, generator=gen).to(t.dtype) for t in outs]
    cotangents = [c.to(t.dtype) for c, t in zip(cotangents, outs)]
    return [*outs, *torch.autograd.grad(outs, leaves, cotangents)], cotangents


# the fp16 twin of a bf16 case (tests/util.py rounding_verdict) also raises the 16-bit path's
# own precisions to fp32 (MesaLaunch.prec, cg_prec, the solves' operands), as
# tests/gpu/test_nan_cases_gpu.py's MESA_TWIN does: what is left is the inputs' and outputs'
# rounding, which shrinks with the dtype
TWIN_SETTINGS = {"prec": "ieee", "cg_prec": "ieee"}
TWIN_SOLVE = {"operands": "fp32"}


@functools.cache
def errors_of(case: str, twin: bool = False) -> dict:
    """Errors of every output and gradient of one case against the exact fp64 reference:
    rel_err under each quantity's name, row_err under "<name> (worst row)"; with twin, of its
    fp16 twin (fp16 q, k, v and TWIN_SETTINGS)."""
    from kernels.common.launch import launch_settings
    from kernels.common.triton import utils
    from kernels.mesa import mesa
    from kernels.mesa.reference import mesa_reference
    from kernels.mesa.state import MesaState

    B, T, H, K, V, dtype, gates, options = {**CASES, **PAIRED}[case]
    options = dict(options)
    tuning = options.pop("tuning", {})
    grads = options.pop("grads", {})
    dtype = torch.float16 if twin else dtype
    base = make_inputs(B, T, H, K, V, gates)
    scale = K**-0.5
    # q, k, v in the case's dtype; g, beta, lamb, states fp32 (as a layer would pass them)
    ours = [t.to(dtype) if i < 3 else t for i, t in enumerate(base)]
    ours = [t.detach().clone().requires_grad_(True) for t in ours]
    ref = [t.detach().double().requires_grad_(True) for t in ours]

    def run_ours(x):
        with triton_ran("mesa"):
            return mesa(*x[:6], scale=scale, initial_state=MesaState(*x[6:]), output_final_state=True,
                        backend="triton", chunk_size=64, **options)

    def run_ref(x):
        return mesa_reference(*x[:6], scale, initial_state=MesaState(*x[6:]), output_final_state=True)

    utils.DEBUG.poison = True
    # tuning: cg_operands -> both solves' operands; any other key -> both solves' field of that name
    solve = {("operands" if key == "cg_operands" else key): value for key, value in tuning.items()}
    solve = {**solve, **TWIN_SOLVE} if twin else solve
    changes = {part: solve for part in ("fwd_solve", "bwd_solve")} if solve else {}
    changes = {**changes, "grads": grads} if grads else changes
    try:
        with launch_settings(mesa={**changes, **(TWIN_SETTINGS if twin else {})}):
            got, cotangents = _outputs_and_grads(run_ours, ours)
    finally:
        utils.DEBUG.poison = False
    want, _ = _outputs_and_grads(run_ref, ref, cotangents)
    errors = {name: rel_err(a, b) for name, a, b in zip(QUANTITIES, got, want)}
    errors.update({f"{name} (worst row)": row_err(a, b) for name, a, b in zip(QUANTITIES, got, want)})
    record_gpu_errors(f"{case} fp16 twin" if twin else case, errors)
    return errors


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("quantity", QUANTITIES)
def test_matches_exact_fp64(case, quantity):
    """Whole tensor within TOL, worst row within ROW_TOL; a bf16 worst row over ROW_TOL passes
    only as rounding, judged against the case's fp16 twin (errors_of(case, twin=True))."""
    errors = errors_of(case)
    dtype = CASES[case][5]
    whole, row = errors[quantity], errors[f"{quantity} (worst row)"]
    assert whole < TOL[dtype], f"{case} {quantity}: {whole:.3e} >= {TOL[dtype]} (all: {errors})"
    if row < ROW_TOL[dtype]:
        return
    why = "no fp16 twin for this dtype"
    if dtype == torch.bfloat16:
        twin = errors_of(case, twin=True)
        why = rounding_verdict(row, twin[quantity], twin[f"{quantity} (worst row)"])
    assert why is None, f"{case} {quantity} (worst row): {row:.3e} >= {ROW_TOL[dtype]}, and {why} (all: {errors})"


def test_narrow_warps_match_wide_warps():
    """The K = 64 strong-gate case with its CG programs at the narrow warps (4, the default
    there) and at 8: every output's and gradient's error against the exact solve, worst rows
    included, the same to within 1 % (the two differ only in the order of fp32 sums; one H100
    gave them equal to 3-4 digits, results/findings/gpu_test_errors_h100_20261206_mesa_warps.json)."""
    narrow, wide = errors_of("bf16_T2100_K64_strong_vs_exact"), errors_of("bf16_T2100_K64_strong_8warps")
    apart = {n: (narrow[n], wide[n]) for n in narrow if abs(narrow[n] - wide[n]) > 0.01 * wide[n] + 1e-7}
    assert not apart, f"narrow / wide warps' errors apart: {apart}"


def test_rows_per_program_match():
    """The K = 64 strong-gate case with both CG solves at 64 rows a program (the narrow_rows
    default: the backward's 32 rows hold above K = 64) and at 32: every output's and gradient's
    error against the exact solve the same to within 1 % (each token's system is solved on its
    own; only how dlamb's partial sums are grouped differs)."""
    wide, narrow = errors_of("bf16_T2100_K64_strong_vs_exact"), errors_of("bf16_T2100_K64_strong_rows32")
    apart = {n: (wide[n], narrow[n]) for n in wide if abs(wide[n] - narrow[n]) > 0.01 * narrow[n] + 1e-7}
    assert not apart, f"64 / 32 rows' errors apart: {apart}"


@pytest.mark.parametrize("case", ["bf16_T2100_K64_strong_vs_exact", "bf16_T2100_strong_vs_exact"])
def test_gradient_kernel_at_8_warps_over_the_whole_k(case):
    """The gradient kernel at 8 warps over the whole K (GradsLaunch; the default is 4 warps
    over 32-column key blocks): every output's and gradient's error against the exact solve
    the same as the default's to within 1 % (only the gradient kernel's sums are ordered
    differently; the forward, and so o and the states, do not change). The case's name is the
    CASES one, so that the default's errors come from the same worker's cache."""
    default, wide = errors_of(case), errors_of(case.replace("_vs_exact", "_grads_8w_whole_k"))
    apart = {n: (wide[n], default[n]) for n in default if abs(wide[n] - default[n]) > 0.01 * default[n] + 1e-7}
    assert not apart, f"gradient kernel at 8 warps over the whole K / default: errors apart: {apart}"
