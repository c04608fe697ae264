"""Triton linearized softmax GDN (docs/design.md §7) on a CUDA GPU at a real shape (docs/design.md §9).

bf16, B = 1, T = 8192, H = 2, K = V = 128, fresh and from a state with count > 0, through
linearized_softmax_gdn(backend="triton") (each case asserts that the Triton entry point
ran), against the chunked PyTorch backend run in fp64 on the same GPU: o, the final
LinGDNState and the gradients of q, k, v and of the state's h, k_sum, v_sum. Also the
Triton running-mean preprocessing alone (triton_prep.py, called directly: it has no other
backend to fall back to) against the per-token form of the CPU tests in fp64
(running_means_loop). Each error is held to TOL (whole tensor) and ROW_TOL (worst row,
tests/util.py); all buffers the kernels write start as NaN. From a fresh state the first
tokens' o and gradients are 15-30x the typical row (o_1 = v_1 while later outputs average
many values), so their bf16 rounding alone exceeds ROW_TOL against the typical row (the
PyTorch backend in bf16 measures 0.06-0.08 there on the CPU); such a worst row passes only as
rounding, judged by the same case with fp16 inputs (tests/util.py rounding_verdict).

Skipped without CUDA, and in a session where TRITON_INTERPRET is set (run tests/gpu in a
pytest session of its own). Errors are printed (-s) and, when GPU_ERRORS_JSON names a file,
written there.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.gpu.backends import triton_ran
from tests.util import GPU_ONLY, ROW_TOL, TOL, record_gpu_errors, rel_err, rounding_verdict, row_err

pytestmark = GPU_ONLY

pytest.importorskip("triton")

B, T, H, D = 1, 8192, 2, 128


def make_leaves(count: int, seed: int, dtype: torch.dtype = torch.bfloat16) -> list[torch.Tensor]:
    """q, k (unit norm: the §7 transition contracts from the first tokens on), v in dtype (the
    same values for every dtype, up to its rounding) and, for count > 0, a state h, k_sum,
    v_sum in fp32 of the size count tokens would give."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dev = "cuda"
    leaves = [torch.randn(B, T, H, D, device=dev, generator=gen).to(dtype),
              F.normalize(torch.randn(B, T, H, D, device=dev, generator=gen), dim=-1).to(dtype),
              torch.randn(B, T, H, D, device=dev, generator=gen).to(dtype)]
    if count:
        leaves += [0.1 * torch.randn(B, H, D, D, device=dev, generator=gen),
                   F.normalize(torch.randn(B, H, D, device=dev, generator=gen), dim=-1) * count**0.5,
                   count**0.5 * torch.randn(B, H, D, device=dev, generator=gen)]
    return leaves


def measured_errors(pairs: dict, case: str) -> dict:
    """{name: (ours, reference)} -> rel_err under each name and row_err under "<name> (worst
    row)", recorded under `case`."""
    errors = {n: rel_err(a, b) for n, (a, b) in pairs.items()}
    errors.update({f"{n} (worst row)": row_err(a, b) for n, (a, b) in pairs.items()})
    record_gpu_errors(case, errors)
    return errors


def bf16_errors(pairs: dict, case: str, twin=None) -> dict:
    """measured_errors, asserted under bf16's TOL and ROW_TOL; with twin (a callable giving
    the same case's errors with fp16 inputs), a worst row over ROW_TOL passes when it is
    rounding (tests/util.py rounding_verdict)."""
    errors = measured_errors(pairs, case)
    tol, row_tol = TOL[torch.bfloat16], ROW_TOL[torch.bfloat16]
    bad = {n: e for n, e in errors.items() if not e < (row_tol if n.endswith("(worst row)") else tol)}
    if twin is not None and bad and all(n.endswith(" (worst row)") for n in bad):
        twin_errors = twin()
        bad = {n: f"{e:.3e}, and {why}" for n, e in bad.items()
               if (why := rounding_verdict(e, twin_errors[n.removesuffix(" (worst row)")], twin_errors[n]))}
    assert not bad, f"{case}: errors over {tol} (rows {row_tol}): {bad} (all: {errors})"
    return errors


# The running mean of v (LinGdnLaunch.mean_form): in-chunk sums by tl.cumsum or on the tensor
# cores, the latter also inside the fused training pass (forced on: this shape has too few
# heads for it and K = 128 is over train_fused_max_K), into a tile of their own or into the
# output's (mean_in_acc); or written whole by the scan in v's dtype and only added ("stored")
MEAN_FORMS = {
    "mean_scan": {"linearized_softmax_gdn": {"mean_form": "scan"}},
    "mean_dots": {"linearized_softmax_gdn": {"mean_form": "dots", "mean_in_acc": "never"}},
    "mean_dots_fused": {"linearized_softmax_gdn": {"mean_form": "dots", "mean_in_acc": "never",
                                                   "train_fused_max_K": 128},
                        "gated_delta_rule": {"fused_fwd": {"enabled": True, "min_heads": 1}}},
    "mean_dots_acc_fused": {"linearized_softmax_gdn": {"mean_form": "dots", "mean_in_acc": "always",
                                                       "train_fused_max_K": 128},
                            "gated_delta_rule": {"fused_fwd": {"enabled": True, "min_heads": 1}}},
    "mean_stored": {"linearized_softmax_gdn": {"mean_form": "stored"}},
    "mean_stored_fused": {"linearized_softmax_gdn": {"mean_form": "stored", "train_fused_max_K": 128},
                          "gated_delta_rule": {"fused_fwd": {"enabled": True, "min_heads": 1}}},
}


def public_op_pairs(count: int, form: str, dtype: torch.dtype) -> dict:
    """{name: (ours, fp64 reference)} of o, the final state and every input gradient through
    the public op in MEAN_FORMS[form], from inputs in dtype."""
    lin = pytest.importorskip("kernels.linearized_softmax_gdn")
    from kernels.common.launch import launch_settings
    from kernels.common.triton import utils

    leaves = make_leaves(count, seed=7 + count, dtype=dtype)
    ours = [x.detach().clone().requires_grad_(True) for x in leaves]
    ref = [x.detach().double().requires_grad_(True) for x in leaves]
    st = lin.LinGDNState(*ours[3:], count) if count else None
    st_ref = lin.LinGDNState(*ref[3:], count) if count else None
    gen = torch.Generator(device="cuda").manual_seed(1234)
    do = torch.randn(B, T, H, D, device="cuda", generator=gen).to(dtype)
    d_state = [torch.randn(s, device="cuda", generator=gen) for s in ((B, H, D, D), (B, H, D), (B, H, D))]
    utils.DEBUG.poison = True
    try:
        with triton_ran("linearized_softmax_gdn"), launch_settings(**MEAN_FORMS[form]):
            o, s = lin.linearized_softmax_gdn(*ours[:3], initial_state=st, output_final_state=True, backend="triton")
            grads = torch.autograd.grad((o, *s[:3]), ours, (do, *d_state))
    finally:
        utils.DEBUG.poison = False
    o_ref, s_ref = lin.linearized_softmax_gdn(*ref[:3], initial_state=st_ref, output_final_state=True,
                                              backend="torch")
    grads_ref = torch.autograd.grad((o_ref, *s_ref[:3]), ref, (do.double(), *(x.double() for x in d_state)))
    assert o.dtype == dtype and s.count == count + T
    pairs = {"o": (o, o_ref), "h": (s.h, s_ref.h), "k_sum": (s.k_sum, s_ref.k_sum), "v_sum": (s.v_sum, s_ref.v_sum)}
    pairs.update({n: (a, b) for n, a, b in zip(("dq", "dk", "dv", "dh0", "dk_sum0", "dv_sum0"), grads, grads_ref)})
    return pairs


@pytest.mark.parametrize("form", list(MEAN_FORMS))
@pytest.mark.parametrize("count", [0, 37])
def test_lin_gdn_bf16_T8192_matches_fp64_chunked(count, form):
    """Through the public op, in each of MEAN_FORMS; a worst row over ROW_TOL is judged
    against the same case with fp16 inputs."""
    case = f"lin_gdn_bf16_T{T}_count{count}" + ("" if form == "mean_scan" else f"_{form}")
    pairs = public_op_pairs(count, form, torch.bfloat16)
    bf16_errors(pairs, case, lambda: measured_errors(public_op_pairs(count, form, torch.float16), f"{case}_fp16_twin"))


@pytest.mark.parametrize(("by_dot", "segment_rows"), [(False, 0), (True, 0), (True, 2048)],
                         ids=["scans", "dots", "dots_segments"])
def test_lin_gdn_prep_bf16_T8192_matches_loop(by_dot, segment_rows):
    """The preprocessing alone, from a state (count 37), every output (the entering sums of v
    for its running mean) and input gradient, against the per-token form written from the
    definitions (8192 steps of a loop in fp64); the in-tile sums by tl.cumsum or on the
    tensor cores (PrepLaunch.fwd_by_dot, bwd_by_dot), in one pass or in four segments
    (PrepLaunch.segment_rows)."""
    import dataclasses

    from kernels.common.launch import settings
    from kernels.common.triton import utils
    from tests.kernels.triton.test_lin_gdn_triton import PREP_NAMES, run_prep

    count = 37
    leaves = make_leaves(count, seed=3)
    leaves = [leaves[1], leaves[2], leaves[4], leaves[5]]  # k, v, k_sum, v_sum
    utils.DEBUG.poison = True
    try:
        cfg = dataclasses.replace(settings("linearized_softmax_gdn").prep, fwd_by_dot=by_dot, bwd_by_dot=by_dot,
                                  segment_rows=segment_rows)
        out, grads, out_ref, grads_ref = run_prep(leaves, count, torch.bfloat16, cfg)
    finally:
        utils.DEBUG.poison = False
    names = (*PREP_NAMES, "dk", "dv", "dk_sum0", "dv_sum0")
    bf16_errors(dict(zip(names, zip((*out, *grads), (*out_ref, *grads_ref)))),
                f"lin_gdn_prep_bf16_T{T}" + ("_dots" if by_dot else "") + (f"_segments{segment_rows}" if segment_rows else ""))


@pytest.mark.parametrize("mean_form", ["scan", "dots", "dots_acc", "stored"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "two_kernels"])
def test_lin_gdn_bf16_T8192_forward_without_gradient(fused, mean_form):
    """The no-gradient forward (lin_gdn_infer; its running mean added in the fused state pass
    or in the output kernel, forced here; "dots_acc": the dots into the output's accumulator,
    LinGdnLaunch.mean_in_acc; "stored": the mean written whole by the scan): o and the final
    state against the fp64 chunked form, from a state (count 37)."""
    lin = pytest.importorskip("kernels.linearized_softmax_gdn")
    from kernels.common.launch import launch_settings
    from kernels.common.triton import utils

    count = 37
    leaves = make_leaves(count, seed=7 + count)  # test_lin_gdn_bf16_T8192_matches_fp64_chunked's inputs
    st = lin.LinGDNState(*leaves[3:], count)
    utils.DEBUG.poison = True
    try:
        with launch_settings(gated_delta_rule={"infer_fused": {"enabled": fused, "min_heads": 1}},
                             linearized_softmax_gdn={"mean_form": mean_form.removesuffix("_acc"),
                                                     "mean_in_acc": "always" if mean_form.endswith("_acc")
                                                     else "never"}), \
                triton_ran("linearized_softmax_gdn"), torch.no_grad():
            o, s = lin.linearized_softmax_gdn(*leaves[:3], initial_state=st, output_final_state=True, backend="triton")
    finally:
        utils.DEBUG.poison = False
    ref = [x.double() for x in leaves]
    o_ref, s_ref = lin.linearized_softmax_gdn(*ref[:3], initial_state=lin.LinGDNState(*ref[3:], count),
                                              output_final_state=True, backend="torch")
    pairs = {"o": (o, o_ref), "h": (s.h, s_ref.h), "k_sum": (s.k_sum, s_ref.k_sum), "v_sum": (s.v_sum, s_ref.v_sum)}
    bf16_errors(pairs, f"lin_gdn_bf16_T{T}_count{count}_no_gradient_{'fused' if fused else 'two_kernels'}"
                + ("" if mean_form == "scan" else f"_mean_{mean_form}"))
