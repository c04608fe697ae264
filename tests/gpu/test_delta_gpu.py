"""Triton delta rule, gated delta rule and linearized softmax GDN on a CUDA GPU (docs/design.md §9).

bf16 at T up to 32k with K = V = 128 (plus fp32 and fp16 at awkward shapes), against the
chunked PyTorch form (kernels/gated_delta_rule/chunked.py) run in fp64 on the same GPU (the
per-token loop is too slow at these lengths); the linearized form against its per-token
recurrence (docs/design.md §7) in fp64. The ops run through their public functions with
backend="triton", and each case asserts that the Triton entry point ran. Each output and
each gradient (q, k, v, beta, g, initial state) is its own test item, so a failure names the
gradient, held to TOL (whole tensor) and ROW_TOL (worst row, tests/util.py); a worst row over
ROW_TOL passes only within twice what rounding the fp64 reference to the output's dtype gives
(tests/util.py rounding_floor), or, in bf16, when the same case with fp16 inputs shrinks it as
rounding does (rounding_verdict). All buffers the kernels write start as NaN.

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
from tests.util import (
    GPU_ONLY,
    ROUNDING_FLOOR_FACTOR,
    ROW_TOL,
    TOL,
    record_gpu_errors,
    rel_err,
    rounding_floor,
    rounding_verdict,
    row_err,
)

pytestmark = GPU_ONLY

pytest.importorskip("triton")

# name: (op, B, T, H, K, V, dtype, gate kind)
CASES = {
    "gdn_bf16_T32768": ("gdn", 1, 32768, 2, 128, 128, torch.bfloat16, "near0"),
    "gdn_bf16_T4100_strong": ("gdn", 2, 4100, 2, 128, 128, torch.bfloat16, "strong"),
    "delta_bf16_T32768": ("delta", 1, 32768, 2, 128, 128, torch.bfloat16, None),
    "gdn_fp32_T300_K100_V60": ("gdn", 2, 300, 3, 100, 60, torch.float32, "near0"),
    "delta_fp16_T75_K64_V256": ("delta", 1, 75, 2, 64, 256, torch.float16, None),
    "gdn_bf16_T1000_K256_V32": ("gdn", 1, 1000, 2, 256, 32, torch.bfloat16, "near0"),
    # head dim 64, where GDN's launch rules differ (narrowing, dU_local in the state pass)
    "gdn_bf16_T2100_K64_strong": ("gdn", 2, 2100, 2, 64, 64, torch.bfloat16, "strong"),
}
QUANTITIES = ("o", "final_state", "dq", "dk", "dv", "dbeta", "dg", "dinitial_state")


def make_inputs(B, T, H, K, V, dtype, gate, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dev = "cuda"
    q = torch.randn(B, T, H, K, device=dev, generator=gen).to(dtype)
    k = F.normalize(torch.randn(B, T, H, K, device=dev, generator=gen), dim=-1).to(dtype)
    v = torch.randn(B, T, H, V, device=dev, generator=gen).to(dtype)
    tensors = {"q": q, "k": k, "v": v}
    if gate == "near0":
        tensors["g"] = F.logsigmoid(torch.randn(B, T, H, device=dev, generator=gen) + 4.0)
    elif gate == "strong":
        tensors["g"] = -12.0 * torch.rand(B, T, H, device=dev, generator=gen)
    tensors["beta"] = torch.sigmoid(torch.randn(B, T, H, device=dev, generator=gen)).to(dtype)
    h0 = torch.randn(B, H, K, V, device=dev, generator=gen)
    return tensors, h0


@functools.lru_cache(maxsize=None)
def errors_of(case: str, dtype: torch.dtype | None = None) -> dict:
    """Errors of every output and gradient of one case (in `dtype` where given, its twin in
    that dtype) against the fp64 chunked form: rel_err under each quantity's name, row_err
    under "<name> (worst row)"."""
    from kernels import delta_rule, gated_delta_rule
    from kernels.common.triton import utils
    from kernels.gated_delta_rule.chunked import chunk_gated_delta_rule

    name, B, T, H, K, V, case_dtype, gate = CASES[case]
    dtype = dtype or case_dtype
    op, op_name = (gated_delta_rule, "gated_delta_rule") if name == "gdn" else (delta_rule, "delta_rule")
    tensors, h0 = make_inputs(B, T, H, K, V, dtype, gate)
    leaves = dict(tensors, initial_state=h0)
    ours = {n: t.detach().clone().requires_grad_(True) for n, t in leaves.items()}
    utils.DEBUG.poison = True
    try:
        with triton_ran(op_name):
            o, ht = op(**ours, scale=K**-0.5, output_final_state=True, backend="triton")
        gen = torch.Generator(device="cuda").manual_seed(1234)
        do = torch.randn(o.shape, device="cuda", generator=gen).to(o.dtype)
        dht = torch.randn(ht.shape, device="cuda", generator=gen)
        grads = torch.autograd.grad((o, ht), list(ours.values()), (do, dht))
    finally:
        utils.DEBUG.poison = False
    ref = {n: t.detach().double().requires_grad_(True) for n, t in leaves.items()}
    o_ref, ht_ref = chunk_gated_delta_rule(
        ref["q"], ref["k"], ref["v"], ref.get("g"), ref["beta"], K**-0.5,
        initial_state=ref["initial_state"], output_final_state=True)
    grads_ref = torch.autograd.grad((o_ref, ht_ref), list(ref.values()), (do.double(), dht.double()))
    pairs = {"o": (o, o_ref), "final_state": (ht, ht_ref)}
    pairs.update({"d" + n: (grad, grad_ref) for n, grad, grad_ref in zip(ours, grads, grads_ref)})
    errors = all_errors(pairs)
    record_gpu_errors(case if dtype == case_dtype else f"{case} as {str(dtype).removeprefix('torch.')}", errors)
    return errors


FLOOR = " (rounding floor)"


def all_errors(pairs: dict) -> dict:
    """{name: (ours, reference)} -> rel_err under each name, row_err under "<name> (worst row)"
    and, under "<name> (rounding floor)", the worst row that rounding the reference to ours's
    dtype makes (tests/util.py rounding_floor; not an error of ours)."""
    errors = {name: rel_err(a, b) for name, (a, b) in pairs.items()}
    errors.update({f"{name} (worst row)": row_err(a, b) for name, (a, b) in pairs.items()})
    errors.update({f"{name}{FLOOR}": rounding_floor(b, a.dtype) for name, (a, b) in pairs.items()})
    return errors


def measured(errors: dict) -> dict:
    """The errors of ours in all_errors' dict, without the rounding floors."""
    return {n: e for n, e in errors.items() if not n.endswith(FLOOR)}


def assert_within(errors: dict, dtype: torch.dtype, label: str) -> None:
    """Every whole-tensor error under TOL[dtype], every worst-row error under ROW_TOL[dtype]."""
    bad = {n: e for n, e in measured(errors).items()
           if not e < (ROW_TOL[dtype] if n.endswith("(worst row)") else TOL[dtype])}
    assert not bad, f"{label}: errors over TOL / ROW_TOL ({TOL[dtype]} / {ROW_TOL[dtype]}): {bad} (all: {errors})"


@pytest.mark.parametrize("case", ["gdn_bf16_T4100_strong", "delta_fp16_T75_K64_V256"])
def test_fused_state_output(case):
    """The forward with the output fused into the state pass (DeltaLaunch.fused_fwd, on from
    256 sequences of heads), forced on, against the state pass then the output kernel, forced
    off, each against fp64 (over_bounds_against: the two round the same products; a bf16 worst
    row can sit over ROW_TOL by rounding alone, which test_matches_fp64_chunked judges on the
    default path: GDN's output at 4,100 tokens under strong gates, 0.0325 on one H100 against a
    rounding floor of 0.0207, 2026-12-07)."""
    fused, split = ({"fused_fwd": {"enabled": on, "min_heads": 1}} for on in (True, False))
    errors = variant_errors(case, fused)
    bad = over_bounds_against(case, errors, variant_errors(case, split))
    assert not bad, f"{case} fused: (error, two-kernel error) over the bounds: {bad} (all: {errors})"


def over_bounds_against(case: str, errors: dict, baseline: dict) -> dict:
    """The quantities of `errors` (a launch variant's, errors_of's form) over their bounds: whole
    tensors over TOL, worst rows over ROW_TOL and more than 1.1x the baseline path's (whose own
    worst rows test_matches_fp64_chunked holds), as {name: (error, baseline error)}."""
    dtype = CASES[case][6]
    return {n: (e, baseline[n]) for n, e in measured(errors).items()
            if not (e < ROW_TOL[dtype] or e <= 1.1 * baseline[n] if n.endswith("(worst row)") else e < TOL[dtype])}


def variant_errors(case: str, over: dict) -> dict:
    """errors_of `case` with the delta rules' launch settings `over` (not the cached figures of
    the defaults)."""
    from kernels.common.launch import launch_settings

    with launch_settings(delta_rule=over, gated_delta_rule=over):
        return errors_of.__wrapped__(case)


@pytest.mark.parametrize("case", ["gdn_bf16_T4100_strong", "delta_bf16_T32768", "delta_fp16_T75_K64_V256",
                                  "gdn_bf16_T1000_K256_V32"])
def test_local_du_in_state_bwd(case):
    """The backward state pass forming dU_local itself (StateBwdLaunch.local_du) against
    du_local's launch then the pass, each against fp64: every output and gradient within TOL,
    and every worst row within ROW_TOL or no more than 1.1x the two-launch path's (the paths
    differ in dU_local's rounding only)."""
    local, split = ({"state_bwd": {"local_du": on, "min_heads": 1, "max_K": 256}} for on in (True, False))
    errors = variant_errors(case, local)
    bad = over_bounds_against(case, errors, variant_errors(case, split))
    assert not bad, f"{case} local dU: (error, two-launch error) over the bounds: {bad} (all: {errors})"


@pytest.mark.parametrize("case", ["gdn_bf16_T4100_strong", "delta_bf16_T32768", "delta_fp16_T75_K64_V256",
                                  "gdn_bf16_T1000_K256_V32"])
def test_row_factors_on_v_in_state_bwd(case):
    """The backward state pass with its row factors on the dO tile and the Kd dS product
    (StateBwdLaunch.factors_on_v, GDN's default) against the factors on q and k, each against
    fp64 (over_bounds_against; the two round different operands to 16 bits)."""
    errors = variant_errors(case, {"state_bwd": {"factors_on_v": True}})
    bad = over_bounds_against(case, errors, variant_errors(case, {"state_bwd": {"factors_on_v": False}}))
    assert not bad, f"{case} factors on V: (error, default's error) over the bounds: {bad} (all: {errors})"


@pytest.mark.parametrize("case", ["delta_bf16_T32768", "delta_fp16_T75_K64_V256", "gdn_bf16_T4100_strong"])
def test_dqkw_over_v_blocks(case):
    """The dq/dk/dW kernel over 64-column V-blocks (dqkw BV 64; DeltaNet's default is one
    128-column block, GDN's 64) against the default, each against fp64 (over_bounds_against;
    the two differ in the order of the sums over V only)."""
    errors = variant_errors(case, {"dqkw": {"BV": 64}})
    bad = over_bounds_against(case, errors, errors_of(case))
    assert not bad, f"{case} dqkw BV 64: (error, default's error) over the bounds: {bad} (all: {errors})"


@pytest.mark.parametrize("case", ["delta_bf16_T32768", "delta_fp16_T75_K64_V256", "gdn_bf16_T4100_strong"])
def test_dk_part_in_16_bits(case):
    """dqkw storing dk's share from the output and the state in the input dtype
    (DqkwLaunch.dk_part_16bit, DeltaNet's default) against an fp32 share, each against fp64
    (over_bounds_against; dk carries one rounding more of that share)."""
    errors = variant_errors(case, {"dqkw": {"dk_part_16bit": True}})
    bad = over_bounds_against(case, errors, variant_errors(case, {"dqkw": {"dk_part_16bit": False}}))
    assert not bad, f"{case} dk_part in 16 bits: (error, fp32 share's error) over the bounds: {bad} (all: {errors})"


@pytest.mark.parametrize("case", ["delta_fp16_T75_K64_V256", "gdn_bf16_T2100_K64_strong"])
def test_dqkw_narrow_value_blocks(case):
    """The dq/dk/dW kernel over 32-column V-blocks at head dims up to 64 (DqkwLaunch.narrow_BV
    32, a candidate; 4 warps at 32-column blocks have miscompiled other delta-rule kernels on
    the H200, NarrowVLaunch) against the default, each against fp64 (over_bounds_against; the
    two differ in the order of the sums over V only)."""
    errors = variant_errors(case, {"dqkw": {"narrow_BV": 32}})
    bad = over_bounds_against(case, errors, errors_of(case))
    assert not bad, f"{case} dqkw narrow_BV 32: (error, default's error) over the bounds: {bad} (all: {errors})"


K_LOOP_CASES = [
    *[(case, {"k_loop": True, "BV": 64}) for case in ("gdn_bf16_T4100_strong", "delta_bf16_T32768",
                                                      "gdn_bf16_T1000_K256_V32", "gdn_fp32_T300_K100_V60")],
    *[(case, {"k_loop": True, "BK": 32}) for case in ("gdn_bf16_T4100_strong", "gdn_bf16_T2100_K64_strong")],
]


@pytest.mark.parametrize("case, dqkw", K_LOOP_CASES)
def test_dqkw_k_loop(case, dqkw):
    """The dq/dk/dW kernel with one program a chunk walking the K-blocks (DqkwLaunch.k_loop, off
    by default; two to four 64- or 32-key blocks here, a partial one at K = 100) against the
    default, each against fp64 (over_bounds_against; the two differ in where dg's per-block
    shares are summed and in dP's rounding to 16 bits once rather than per block)."""
    errors = variant_errors(case, {"dqkw": dqkw})
    bad = over_bounds_against(case, errors, errors_of(case))
    assert not bad, f"{case} dqkw {dqkw}: (error, default's error) over the bounds: {bad} (all: {errors})"


FUSED_WY_CASES = [
    *[(case, {"fuse_wy_bwd": True}) for case in ("gdn_bf16_T4100_strong", "delta_bf16_T32768",
                                                 "gdn_bf16_T2100_K64_strong", "gdn_fp32_T300_K100_V60",
                                                 "delta_fp16_T75_K64_V256")],
    *[(case, {"fuse_wy_bwd": True, "BK": 32}) for case in ("gdn_bf16_T4100_strong", "gdn_bf16_T2100_K64_strong")],
]


@pytest.mark.parametrize("case, dqkw", FUSED_WY_CASES)
def test_dqkw_fused_with_wy_bwd(case, dqkw):
    """dqkw and the WY backward as one kernel a chunk (DqkwLaunch.fuse_wy_bwd, off by default; its
    second half reads back what its first half wrote, after a CTA barrier, which the
    interpreter cannot show; its dqkw half over 64- or 32-key blocks) against the default,
    each against fp64 (over_bounds_against; the two differ as test_dqkw_k_loop's do)."""
    errors = variant_errors(case, {"dqkw": dqkw})
    bad = over_bounds_against(case, errors, errors_of(case))
    assert not bad, f"{case} dqkw {dqkw}: (error, default's error) over the bounds: {bad} (all: {errors})"


STORE_P_CASES = [
    *[(case, {"store_p": True}) for case in ("gdn_bf16_T4100_strong", "delta_bf16_T32768", "gdn_bf16_T2100_K64_strong",
                                             "gdn_fp32_T300_K100_V60", "delta_fp16_T75_K64_V256")],
    ("gdn_bf16_T4100_strong", {"store_p": True, "state_bwd": {"max_K": 256}}),
    ("gdn_bf16_T4100_strong", {"store_p": True, "fused_fwd": {"enabled": True, "min_heads": 1}}),
    *[(case, {"p_in_wy": True}) for case in ("gdn_bf16_T4100_strong", "delta_bf16_T32768", "gdn_bf16_T2100_K64_strong",
                                             "gdn_fp32_T300_K100_V60")],
    ("gdn_bf16_T4100_strong", {"p_in_wy": True, "fused_fwd": {"enabled": True, "min_heads": 1},
                               "state_bwd": {"max_K": 256}}),
]


@pytest.mark.parametrize("case, over", STORE_P_CASES)
def test_stored_p(case, over):
    """P stored by the training forward's output pass and read by the backward's dU_local
    (DeltaLaunch.store_p, off by default; read by du_local or by the backward state pass, and
    stored by output_fwd or by the fused state pass's first V-block), or formed by wy_fwd and
    read by the output pass too (DeltaLaunch.p_in_wy), against the default, each against fp64
    (over_bounds_against; the paths differ in the order of P's sums, and wy_fwd's in its gamma's
    last fp32 bit)."""
    errors = variant_errors(case, over)
    bad = over_bounds_against(case, errors, errors_of(case))
    assert not bad, f"{case} {over}: (error, default's error) over the bounds: {bad} (all: {errors})"


@pytest.mark.parametrize("case", ["gdn_bf16_T4100_strong", "delta_bf16_T32768", "gdn_bf16_T2100_K64_strong",
                                  "gdn_fp32_T300_K100_V60", "delta_fp16_T75_K64_V256"])
def test_wy_fwd_one_warp(case):
    """The WY preparation on one warp a program (wy_fwd num_warps 1, a candidate; the default
    is 2) against the default, each against fp64 (over_bounds_against; the same products over
    another split of the tiles among threads, so the sums may round in another order)."""
    errors = variant_errors(case, {"wy_fwd": {"num_warps": 1}})
    bad = over_bounds_against(case, errors, errors_of(case))
    assert not bad, f"{case} wy_fwd on one warp: (error, default's error) over the bounds: {bad} (all: {errors})"


@pytest.mark.parametrize("case", ["delta_bf16_T32768", "delta_fp16_T75_K64_V256", "gdn_bf16_T4100_strong"])
def test_wy_bwd_without_readback(case):
    """The WY backward forming dM^T again from transposed products (WyBwdLaunch.dm_readback
    off; the default loads it back transposed from a scratch copy of dM, written and read
    across a program's threads, which the interpreter cannot show) against the default, each
    against fp64 (over_bounds_against; the two differ in how dM^T is rounded only)."""
    errors = variant_errors(case, {"wy_bwd": {"dm_readback": False}})
    bad = over_bounds_against(case, errors, errors_of(case))
    assert not bad, f"{case} dM^T from products: (error, default's error) over the bounds: {bad} (all: {errors})"


@pytest.mark.parametrize("case", ["delta_bf16_T32768", "gdn_bf16_T4100_strong", "gdn_bf16_T1000_K256_V32"])
def test_heads_first_grid(case):
    """The kernels parallel over chunks launched with the sequences of heads on the grid's
    faster axis (DeltaLaunch.heads_first): the same programs in another order, so the same
    errors against fp64 to the last digit as with the chunks first (dU_local in its own
    launch, so that du_local runs too)."""
    own = {"state_bwd": {"local_du": False}}
    errors = variant_errors(case, {"heads_first": True, **own})
    assert errors == variant_errors(case, {"heads_first_from_chunks": 0, **own}), f"{case} heads first: {errors}"


# the no-gradient forward's forms: its state pass with the output fused, at the defaults (at
# these few programs, FusedStateLaunch.few_program_stages) and at num_stages everywhere, or the
# state pass then the output
FORWARD_FORMS = {"fused": {"enabled": True}, "fused_num_stages": {"enabled": True, "few_program_stages": 0},
                 "two_kernels": {"enabled": False}}


def forward_errors(case: str, form: str, dtype: torch.dtype) -> dict:
    """Errors of o and the final state of the forward with no gradient wanted
    (delta_rule_infer: nothing stored for a backward; fused from min_heads sequences of heads
    on, here forced on or off: FORWARD_FORMS), inputs in `dtype`, against the fp64 chunked form."""
    from kernels import delta_rule, gated_delta_rule
    from kernels.common.launch import launch_settings
    from kernels.common.triton import utils
    from kernels.gated_delta_rule.chunked import chunk_gated_delta_rule

    name, B, T, H, K, V, _, gate = CASES[case]
    op, op_name = (gated_delta_rule, "gated_delta_rule") if name == "gdn" else (delta_rule, "delta_rule")
    tensors, h0 = make_inputs(B, T, H, K, V, dtype, gate)
    infer = {"infer_fused": {**FORWARD_FORMS[form], "min_heads": 1}}
    utils.DEBUG.poison = True
    try:
        with launch_settings(delta_rule=infer, gated_delta_rule=infer), triton_ran(op_name), torch.no_grad():
            o, ht = op(**tensors, initial_state=h0, scale=K**-0.5, output_final_state=True, backend="triton")
    finally:
        utils.DEBUG.poison = False
    ref = {n: t.double() for n, t in tensors.items()}
    o_ref, ht_ref = chunk_gated_delta_rule(ref["q"], ref["k"], ref["v"], ref.get("g"), ref["beta"], K**-0.5,
                                           initial_state=h0.double(), output_final_state=True)
    errors = all_errors({"o": (o, o_ref), "final_state": (ht, ht_ref)})
    label = f"{case} no gradient {form.replace('_', ' ')}"
    record_gpu_errors(label if dtype == CASES[case][6] else f"{label} as {str(dtype).removeprefix('torch.')}", errors)
    return errors


@pytest.mark.parametrize("case", ["gdn_bf16_T4100_strong", "gdn_bf16_T32768", "delta_fp16_T75_K64_V256"])
@pytest.mark.parametrize("form", list(FORWARD_FORMS))
def test_forward_without_gradient(case, form):
    """o and the final state of the no-gradient forward, held as the forward with a backward
    is (test_matches_fp64_chunked: a bf16 worst row over ROW_TOL passes only as rounding)."""
    errors = forward_errors(case, form, CASES[case][6])
    for quantity in ("o", "final_state"):
        assert_quantity(case, quantity, errors, lambda: forward_errors(case, form, torch.float16))


def test_tf32x3_dots_hold_the_fp32_bounds():
    """fp32 under torch's "highest" matmul precision with every kernel's fp32_dots="tf32x3"
    (three TF32 tensor-core products per dot instead of scalar FMAs; KernelLaunch.fp32_dots,
    "ieee" by default until timed): every output and gradient within fp32's TOL / ROW_TOL."""
    import dataclasses

    from kernels.common.launch import KernelLaunch, launch_settings, settings

    def every_kernel(op):
        current = settings(op)
        return {f.name: {"fp32_dots": "tf32x3"} for f in dataclasses.fields(current)
                if isinstance(getattr(current, f.name), KernelLaunch)}

    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        with launch_settings(delta_rule=every_kernel("delta_rule"), gated_delta_rule=every_kernel("gated_delta_rule")):
            errors = errors_of.__wrapped__("gdn_fp32_T300_K100_V60")
    finally:
        torch.set_float32_matmul_precision(before)
    assert_within(errors, torch.float32, "gdn_fp32_T300_K100_V60 with tf32x3 dots")


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("quantity", QUANTITIES)
def test_matches_fp64_chunked(case, quantity):
    errors = errors_of(case)
    if quantity not in errors:
        pytest.skip(f"{case} has no {quantity}")
    assert_quantity(case, quantity, errors, lambda: errors_of(case, torch.float16))


def assert_quantity(case: str, quantity: str, errors: dict, twin) -> None:
    """One quantity of a case within TOL (whole tensor) and ROW_TOL (worst row); a worst row
    over ROW_TOL passes within ROUNDING_FLOOR_FACTOR of what rounding the reference to the
    output's dtype gives, or, in bf16, as rounding (tests/util.py ROUNDING_SHRINK), judged
    against the errors of the same case with fp16 inputs, which twin() returns."""
    dtype = CASES[case][6]
    whole, row = errors[quantity], errors[f"{quantity} (worst row)"]
    assert whole < TOL[dtype], f"{case} {quantity}: {whole:.3e} >= {TOL[dtype]} (all: {errors})"
    if row < max(ROW_TOL[dtype], ROUNDING_FLOOR_FACTOR * errors[f"{quantity}{FLOOR}"]):
        return
    why = "no fp16 twin for this dtype"
    if dtype == torch.bfloat16:
        twin_errors = twin()
        why = rounding_verdict(row, twin_errors[quantity], twin_errors[f"{quantity} (worst row)"])
    assert why is None, f"{case} {quantity} (worst row): {row:.3e} >= {ROW_TOL[dtype]}, and {why} (all: {errors})"


def lin_gdn_recurrence(q, k, v, scale, h, k_sum, v_sum, count):
    """docs/design.md §7 one token at a time (any dtype; fp64 here)."""
    outs = []
    for i in range(q.shape[1]):
        t = count + i + 1
        v_bar_prev = v_sum / (t - 1) if t > 1 else torch.zeros_like(v_sum)
        k_sum, v_sum = k_sum + k[:, i], v_sum + v[:, i]
        u, w = k[:, i] - k_sum / t, v[:, i] - v_bar_prev
        uh = torch.einsum("bhk,bhkv->bhv", u, h)
        h = (1 - 1 / t) * h + (1 / t) * u[..., None] * (w - uh)[..., None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, i] * scale, h) + v_sum / t)
    return torch.stack(outs, 1), h


def test_linearized_softmax_gdn_bf16():
    """docs/design.md §7 form at T = 2048 from a state with count > 0, through
    linearized_softmax_gdn(backend="triton"), against its per-token recurrence in fp64;
    gradients of q, k, v and the state tensors."""
    lin = pytest.importorskip("kernels.linearized_softmax_gdn")
    if not hasattr(lin, "LinGDNState"):
        pytest.skip("kernels.linearized_softmax_gdn (LinGDNState) is not written yet")

    B, T, H, D = 1, 2048, 2, 128
    gen = torch.Generator(device="cuda").manual_seed(7)
    q = torch.randn(B, T, H, D, device="cuda", generator=gen).to(torch.bfloat16)
    k = (0.3 * torch.randn(B, T, H, D, device="cuda", generator=gen)).to(torch.bfloat16)
    v = torch.randn(B, T, H, D, device="cuda", generator=gen).to(torch.bfloat16)
    count = 37
    st = [torch.randn(B, H, D, D, device="cuda", generator=gen) * 0.1,
          torch.randn(B, H, D, device="cuda", generator=gen) * 0.3 * count**0.5,
          torch.randn(B, H, D, device="cuda", generator=gen) * count**0.5]
    ours = [x.detach().clone().requires_grad_(True) for x in (q, k, v, *st)]
    ref = [x.detach().double().requires_grad_(True) for x in (q, k, v, *st)]
    with triton_ran("linearized_softmax_gdn"):
        o, s = lin.linearized_softmax_gdn(*ours[:3], scale=D**-0.5, initial_state=lin.LinGDNState(*ours[3:], count),
                                          output_final_state=True, backend="triton")
    o_ref, h_ref = lin_gdn_recurrence(*ref[:3], D**-0.5, *ref[3:], count)
    do = torch.randn(o.shape, device="cuda", generator=gen).to(o.dtype)
    dh = torch.randn(s.h.shape, device="cuda", generator=gen)
    grads = torch.autograd.grad((o, s.h), ours, (do, dh))
    grads_ref = torch.autograd.grad((o_ref, h_ref), ref, (do.double(), dh.double()))
    pairs = {"o": (o, o_ref), "h": (s.h, h_ref)}
    pairs.update({n: (a, b) for n, a, b in zip(("dq", "dk", "dv", "dh0", "dk_sum", "dv_sum"), grads, grads_ref)})
    errors = all_errors(pairs)
    record_gpu_errors("lin_gdn_bf16_T2048", errors)
    assert s.count == count + T
    assert_within(errors, torch.bfloat16, "lin_gdn_bf16_T2048")
