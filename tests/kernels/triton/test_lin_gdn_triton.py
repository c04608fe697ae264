"""Triton linearized softmax GDN (docs/design.md §7) against its per-token recurrence in fp64, on the
CPU interpreter (conftest: TRITON_INTERPRET=1, NaN-poisoned buffers).

Fresh start (count = 0, where t = 1 must write nothing and produce no inf/NaN in values or
gradients) and a continued state (count > 0); outputs, the final LinGDNState and the
gradients of q, k, v and of the state's h, k_sum, v_sum. The Triton running-mean
preprocessing (triton_prep.py) is also tested on its own, values and gradients, with small
tiles so that the scan carries across chunks, against a per-token loop written here from the
definitions (running_means_loop); so is its torch form (running_mean_torch, what fp64 inputs
run)."""

from __future__ import annotations

import pytest
import torch

from tests.util import ROW_TOL, TOL, rel_err, row_err

lin = pytest.importorskip("kernels.linearized_softmax_gdn")
if not hasattr(lin, "LinGDNState"):
    pytest.skip("kernels.linearized_softmax_gdn (LinGDNState) is not written yet", allow_module_level=True)

from kernels.common.launch import launch_settings, settings  # noqa: E402
from kernels.linearized_softmax_gdn import triton_prep  # noqa: E402
from kernels.linearized_softmax_gdn.triton_op import linearized_softmax_gdn_triton  # noqa: E402

LinGDNState = lin.LinGDNState


def recurrence(q, k, v, scale, state):
    """docs/design.md §7 one token at a time, in the inputs' dtype (fp64 here)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    if state is None or state.count == 0:
        h, k_sum, v_sum, count = q.new_zeros(B, H, K, V), q.new_zeros(B, H, K), q.new_zeros(B, H, V), 0
    else:
        h, k_sum, v_sum, count = state
    outs = []
    for i in range(T):
        t = count + i + 1
        v_bar_prev = v_sum / (t - 1) if t > 1 else torch.zeros_like(v_sum)
        k_sum, v_sum = k_sum + k[:, i], v_sum + v[:, i]
        u, w = k[:, i] - k_sum / t, v[:, i] - v_bar_prev
        uh = torch.einsum("bhk,bhkv->bhv", u, h)
        h = (1 - 1 / t) * h + (1 / t) * u[..., None] * (w - uh)[..., None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, i] * scale, h) + v_sum / t)
    return torch.stack(outs, 1), LinGDNState(h, k_sum, v_sum, count + T)


def run_case(B, T, H, K, V, count, dtype, seed, final=True):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen)
    k = 0.4 * torch.randn(B, T, H, K, generator=gen)
    v = torch.randn(B, T, H, V, generator=gen)
    leaves = [q.to(dtype), k.to(dtype), v.to(dtype)]
    if count:
        leaves += [0.1 * torch.randn(B, H, K, V, generator=gen), 0.4 * count**0.5 * torch.randn(B, H, K, generator=gen),
                   count**0.5 * torch.randn(B, H, V, generator=gen)]
    ours = [x.clone().requires_grad_(True) for x in leaves]
    ref = [x.double().requires_grad_(True) for x in leaves]
    st = LinGDNState(*ours[3:], count) if count else None
    st_ref = LinGDNState(*ref[3:], count) if count else None
    o, s = linearized_softmax_gdn_triton(*ours[:3], scale=K**-0.5, initial_state=st, output_final_state=final)
    o_ref, s_ref = recurrence(*ref[:3], K**-0.5, st_ref)
    assert o.dtype == dtype and o.shape == o_ref.shape
    gen_out = torch.Generator().manual_seed(seed + 1)
    do = torch.randn(o.shape, generator=gen_out).to(dtype)
    errors = {"o": rel_err(o, o_ref)}
    if final:
        state_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        assert s.count == count + T and s.h.dtype == s.k_sum.dtype == s.v_sum.dtype == state_dtype
        errors.update(h=rel_err(s.h, s_ref.h), k_sum=rel_err(s.k_sum, s_ref.k_sum), v_sum=rel_err(s.v_sum, s_ref.v_sum))
        dh = torch.randn(s.h.shape, generator=gen_out)
        dk_sum = torch.randn(s.k_sum.shape, generator=gen_out)
        dv_sum = torch.randn(s.v_sum.shape, generator=gen_out)
        outs, cots = (o, s.h, s.k_sum, s.v_sum), (do, dh.to(s.h.dtype), dk_sum.to(s.h.dtype), dv_sum.to(s.h.dtype))
        outs_ref, cots_ref = (o_ref, *s_ref[:3]), tuple(c.double() for c in (do, dh, dk_sum, dv_sum))
    else:
        assert s is None
        outs, cots, outs_ref, cots_ref = (o,), (do,), (o_ref,), (do.double(),)
    grads = torch.autograd.grad(outs, ours, cots)
    grads_ref = torch.autograd.grad(outs_ref, ref, cots_ref)
    for name, a, b in zip(("dq", "dk", "dv", "dh", "dk_sum", "dv_sum"), grads, grads_ref):
        errors[name] = rel_err(a, b)  # inf for any NaN/inf entry
    for name, a, b in zip(("dq", "dk", "dv"), grads, grads_ref):
        errors[f"{name} (worst row)"] = row_err(a, b)
    errors["o (worst row)"] = row_err(o, o_ref)
    # fp64 inputs run the kernels in fp32: fp32's tolerance
    tol = TOL[torch.float32 if dtype == torch.float64 else dtype]
    bad = {n: e for n, e in errors.items() if not e < tol}
    assert not bad, f"errors over {tol:g}: {bad} (all: {errors})"


@pytest.mark.parametrize("T", [1, 63, 64, 100])
def test_fresh_start_fp32(T):
    run_case(1, T, 2, 16, 16, 0, torch.float32, seed=T)


@pytest.mark.parametrize(("T", "K", "V", "count"), [(63, 32, 16, 5), (64, 16, 32, 1), (1, 16, 16, 3)])
def test_continued_state_fp32(T, K, V, count):
    run_case(1, T, 1, K, V, count, torch.float32, seed=3 + T)


def test_no_final_state_fp32():
    run_case(2, 100, 1, 16, 16, 9, torch.float32, seed=11, final=False)


def test_scan_across_chunks_fp32(launch):
    """16-row tiles: the preprocessing's carry crosses chunks (7 of them, the last partial)."""
    launch(linearized_softmax_gdn={"prep": {"tile_elems": 256}})
    run_case(1, 100, 2, 32, 16, 4, torch.float32, seed=12)


@pytest.mark.parametrize("count", [0, 6])
def test_fused_state_output_fp32(launch, count):
    """The delta rule's output fused into its state pass (fused_fwd, on from 256 sequences
    of heads, forced on here; lin_gdn's training pass fuses at head dims up to 64), the
    running mean added there: outputs, final state and every gradient."""
    launch(gated_delta_rule={"fused_fwd": {"enabled": True, "min_heads": 1}})
    run_case(1, 130, 2, 16, 16, count, torch.float32, seed=14 + count)


@pytest.mark.parametrize("count", [0, 6])
def test_training_forward_unfused_fp32(launch, monkeypatch, count):
    """LinGdnLaunch.train_fused False, or a head dim over train_fused_max_K (64 by default,
    lowered to 8 here): the training forward runs the state pass and then the output kernel
    (which adds the running mean) where gated_delta_rule's fused_fwd would fuse them (forced
    on here); outputs, final state and every gradient as fused, and the state pass launched
    without the output (with it at the defaults, K = 16)."""
    from kernels.gated_delta_rule import triton_fwd
    from tests.launch_util import LaunchSpy

    fused = []
    monkeypatch.setattr(triton_fwd, "state_fwd_kernel",
                        LaunchSpy(triton_fwd.state_fwd_kernel, lambda kw: fused.append(kw["FUSE_OUTPUT"])))
    launch(gated_delta_rule={"fused_fwd": {"enabled": True, "min_heads": 1}})
    run_case(1, 130, 2, 16, 16, count, torch.float32, seed=14 + count)
    assert fused == [True]
    for off in ({"train_fused": False}, {"train_fused_max_K": 8}):
        fused.clear()
        with launch_settings(linearized_softmax_gdn=off):
            run_case(1, 130, 2, 16, 16, count, torch.float32, seed=14 + count)
        assert fused == [False], off
    with pytest.raises(ValueError, match="train_fused_max_K"):
        launch(linearized_softmax_gdn={"train_fused_max_K": -1})


def test_fp64_inputs_torch_preprocessing():
    """fp64 inputs: torch preprocessing in fp64, kernels in fp32, fp64 outputs and state."""
    run_case(1, 63, 1, 16, 16, 4, torch.float64, seed=13)


def test_fresh_start_fp16():
    run_case(1, 64, 1, 16, 32, 0, torch.float16, seed=4)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize(("form", "into_acc", "dtype"),
                         [("scan", "never", torch.float16), ("dots", "never", torch.float16),
                          ("dots", "always", torch.float16), ("dots", "always", torch.float32),
                          ("auto", "one_wave", torch.float16), ("scan", "always", torch.float16),
                          ("stored", "always", torch.float16), ("stored", "never", torch.float32)])
def test_running_mean_of_v(launch, monkeypatch, fused, form, into_acc, dtype):
    """The running mean of v the output adds, in each LinGdnLaunch.mean_form: in-chunk sums by
    tl.cumsum or as a product with triangular ones (16-bit v; fp32 keeps the scan), the
    latter into a tile of its own or into the output's (mean_in_acc, which the scan ignores),
    or written whole by the scan and only added ("stored"); in the fused training pass and in
    the output kernel, three chunks, a continued state. The kernels are launched with the form
    asked for ("auto" at K = 16: dots in both; "one_wave" off a GPU: a tile of their own)."""
    from kernels.gated_delta_rule import triton_fwd
    from tests.launch_util import LaunchSpy

    forms = []
    for name in ("state_fwd_kernel", "output_fwd_kernel"):
        monkeypatch.setattr(triton_fwd, name, LaunchSpy(
            getattr(triton_fwd, name),
            lambda kw: forms.append((kw["MEAN_DOT"], kw["MEAN_ACC"], kw["MEAN_STORED"]) if kw["HAS_MEAN"]
                                    else None)))
    launch(gated_delta_rule={"fused_fwd": {"enabled": fused, "min_heads": 1}},
           linearized_softmax_gdn={"mean_form": form, "mean_in_acc": into_acc})
    run_case(1, 130, 2, 16, 32, 6, dtype, seed=41)
    dots = form not in ("scan", "stored") and dtype != torch.float32
    acc = dots and into_acc == "always"
    mean = (dots, acc, form == "stored")
    assert forms == ([mean] if fused else [None, mean])
    with pytest.raises(ValueError, match="mean_form must be one of"):
        launch(linearized_softmax_gdn={"mean_form": "sums"})
    with pytest.raises(ValueError, match="mean_in_acc must be one of"):
        launch(linearized_softmax_gdn={"mean_in_acc": "sometimes"})


def test_auto_mean_form_picks_per_pass():
    """mean_form "auto": the output kernel takes the dots; the fused state pass takes them at
    K <= 64, or at K = 128 where its programs fill at most one wave of the multiprocessors,
    and off a GPU (no multiprocessors) keeps the scan at K = 128; fp32 v keeps the scan in
    every form."""
    from kernels.gated_delta_rule.triton_fwd import RunningMean

    def mean(form, dtype=torch.bfloat16):
        return RunningMean(torch.zeros(1, 4, 1, 8, dtype=dtype), torch.zeros(1, 1, 1, 8), 0, form)

    auto = mean("auto")
    assert auto.sums_by_dot()
    assert auto.sums_by_dot(state_pass=True, K=64, programs=2048, multiprocessors=132)
    assert auto.sums_by_dot(state_pass=True, K=128, programs=132, multiprocessors=132)
    assert not auto.sums_by_dot(state_pass=True, K=128, programs=133, multiprocessors=132)
    assert not auto.sums_by_dot(state_pass=True, K=128, programs=8, multiprocessors=None)
    assert mean("dots").sums_by_dot(state_pass=True, K=128, programs=2048, multiprocessors=132)
    assert not mean("scan").sums_by_dot() and not mean("scan").sums_by_dot(state_pass=True, K=16)
    assert not mean("stored").sums_by_dot() and not mean("stored").sums_by_dot(state_pass=True, K=16)
    assert mean("stored").stored and not auto.stored
    assert not any(mean(form, torch.float32).sums_by_dot(state_pass=True, K=16) or
                   mean(form, torch.float32).sums_by_dot() for form in ("auto", "dots"))


def test_mean_in_acc_picks_per_pass():
    """mean_in_acc "one_wave" (the default): the dots accumulate into the output's tile in the
    fused state pass where its programs fill at most one wave, never in the output kernel or
    off a GPU; "always" everywhere, "never" nowhere."""
    from kernels.common.launch import DEFAULTS
    from kernels.gated_delta_rule.triton_fwd import RunningMean

    def mean(rule):
        return RunningMean(torch.zeros(1, 4, 1, 8, dtype=torch.bfloat16), torch.zeros(1, 1, 1, 8), 0, "auto", rule)

    assert DEFAULTS["linearized_softmax_gdn"].mean_in_acc == "one_wave"
    one_wave = mean("one_wave")
    assert one_wave.accumulates(state_pass=True, programs=128, multiprocessors=132)
    assert not one_wave.accumulates(state_pass=True, programs=512, multiprocessors=132)
    assert not one_wave.accumulates(state_pass=True, programs=8, multiprocessors=None)
    assert not one_wave.accumulates()
    assert mean("always").accumulates() and mean("always").accumulates(state_pass=True, programs=4096)
    assert not mean("never").accumulates(state_pass=True, programs=1, multiprocessors=132)


@pytest.mark.parametrize("count", [0, 9])
def test_public_op_triton_matches_reference(count):
    """Through the public op: backend="triton" against backend="reference" on fp64 copies."""
    gen = torch.Generator().manual_seed(20 + count)
    B, T, H, K, V = 1, 70, 1, 16, 16
    leaves = [torch.randn(B, T, H, K, generator=gen), 0.4 * torch.randn(B, T, H, K, generator=gen),
              torch.randn(B, T, H, V, generator=gen)]
    if count:
        leaves += [0.1 * torch.randn(B, H, K, V, generator=gen), 0.4 * count**0.5 * torch.randn(B, H, K, generator=gen),
                   count**0.5 * torch.randn(B, H, V, generator=gen)]
    ours = [x.clone().requires_grad_(True) for x in leaves]
    ref = [x.double().requires_grad_(True) for x in leaves]
    st = LinGDNState(*ours[3:], count) if count else None
    st_ref = LinGDNState(*ref[3:], count) if count else None
    o, s = lin.linearized_softmax_gdn(*ours[:3], initial_state=st, output_final_state=True, backend="triton")
    o_ref, s_ref = lin.linearized_softmax_gdn(*ref[:3], initial_state=st_ref, output_final_state=True,
                                              backend="reference")
    do = torch.randn(o.shape, generator=gen)
    dh = torch.randn(s.h.shape, generator=gen)
    grads = torch.autograd.grad((o, s.h), ours, (do, dh))
    grads_ref = torch.autograd.grad((o_ref, s_ref.h), ref, (do.double(), dh.double()))
    errors = {"o": rel_err(o, o_ref), "h": rel_err(s.h, s_ref.h)}
    errors.update({f"d{i}": rel_err(a, b) for i, (a, b) in enumerate(zip(grads, grads_ref))})
    bad = {n: e for n, e in errors.items() if not e < TOL[torch.float32]}
    assert s.count == s_ref.count == count + T
    assert not bad, f"errors over {TOL[torch.float32]:g}: {bad} (all: {errors})"


def prep_leaves(B, T, H, K, V, count, seed):
    gen = torch.Generator().manual_seed(seed)
    leaves = [torch.randn(B, T, H, K, generator=gen), torch.randn(B, T, H, V, generator=gen)]
    if count:
        leaves += [count**0.5 * torch.randn(B, H, K, generator=gen), count**0.5 * torch.randn(B, H, V, generator=gen)]
    return leaves


PREP_NAMES = ("key", "value", "v_bar", "k_sum", "v_sum")  # v_bar: the entering sums of v, for prep_fwd


def running_means_loop(k, v, k_sum0, v_sum0, count: int):
    """The preprocessing of docs/design.md §7 one token at a time, from the definitions, in
    the inputs' dtype (fp64 here) and differentiable: at absolute position t = count + 1,
    count + 2, ..., with kbar_t and vbar_t the means of the first t keys and values (the
    state holds the sums of the first `count`) and vbar_0 = 0,

        key_t = k_t - kbar_t,    value_t = (1 - 1/t)(v_t - vbar_{t-1}),    v_bar_t = vbar_t

    k: [B, T, H, K], v: [B, T, H, V]; k_sum0 [B, H, K], v_sum0 [B, H, V], or None for an
    empty state. Returns (key [B, T, H, K], value [B, T, H, V], v_bar [B, T, H, V], the sums
    after the last token [B, H, K] and [B, H, V])."""
    B, T, H, K = k.shape
    V = v.shape[-1]
    k_sum = k_sum0 if k_sum0 is not None else k.new_zeros(B, H, K)
    v_sum = v_sum0 if v_sum0 is not None else v.new_zeros(B, H, V)
    keys, values, v_bars = [], [], []
    for i in range(T):
        t = count + i + 1
        v_bar_prev = v_sum / (t - 1) if t > 1 else torch.zeros_like(v_sum)
        k_sum, v_sum = k_sum + k[:, i], v_sum + v[:, i]
        keys.append(k[:, i] - k_sum / t)
        values.append((1 - 1 / t) * (v[:, i] - v_bar_prev))
        v_bars.append(v_sum / t)
    return torch.stack(keys, 1), torch.stack(values, 1), torch.stack(v_bars, 1), k_sum, v_sum


def prep_errors(out, grads, out_ref, grads_ref) -> dict[str, float]:
    """rel_err and (under "<name> (worst row)") row_err of the outputs and the gradients of
    k, v and, when present, the state's sums."""
    names = (*PREP_NAMES, "dk", "dv", "dk_sum0", "dv_sum0")
    pairs = list(zip(names, (*out, *grads), (*out_ref, *grads_ref)))
    errors = {n: rel_err(a, b) for n, a, b in pairs}
    errors.update({f"{n} (worst row)": row_err(a, b) for n, a, b in pairs})
    return errors


def assert_prep_within(errors, tol, row_tol):
    bad = {n: e for n, e in errors.items() if not e < (row_tol if n.endswith("(worst row)") else tol)}
    assert not bad, f"errors over {tol:g} (rows {row_tol:g}): {bad} (all: {errors})"


def entering_sums(v, v_sum0, chunk=64):
    """[B, T, H, V] -> [B, H, cdiv(T, chunk), V]: v_sum0 (or 0) plus every v before each chunk."""
    B, T, H, V = v.shape
    before = torch.cumsum(v, dim=1) - v
    if v_sum0 is not None:
        before = before + v_sum0[:, None]
    return before[:, ::chunk].permute(0, 2, 1, 3)


def run_prep(leaves, count, dtype, cfg, seed=99):
    """prep_fwd and prep_bwd (launch settings cfg) against running_means_loop in fp64 on
    leaves k, v (and, with count, k_sum0, v_sum0): key, value, the entering sums of v (the
    loop's inputs give theirs) and the final sums; then the gradients of k, v and the state's
    sums for random cotangents of key, value, v_bar and the final sums. Returns (outputs,
    gradients, reference outputs, reference gradients)."""
    leaves[:2] = [x.to(dtype) for x in leaves[:2]]
    ref = [x.double().requires_grad_(True) for x in leaves]
    sums, sums_ref = (leaves[2:], ref[2:]) if count else ([None, None], [None, None])
    key, value, v_enter, k_sum, v_sum = triton_prep.prep_fwd(*leaves[:2], *sums, count, cfg)
    out_ref = running_means_loop(*ref[:2], *sums_ref, count)
    assert [x.dtype for x in (key, value, v_enter, k_sum, v_sum)] == [dtype, dtype] + [torch.float32] * 3
    enter_ref = entering_sums(ref[1].detach(), sums_ref[1].detach() if count else None)
    gen = torch.Generator().manual_seed(seed)
    cots = [torch.randn(x.shape, generator=gen).to(device=x.device, dtype=x.dtype) for x in (key, value, *out_ref[2:])]
    cots[2] = cots[2].to(dtype)  # v_bar's cotangent is o's, in the input dtype
    grads = triton_prep.prep_bwd(*cots, count, (tuple(leaves[0].shape), dtype, leaves[0].device),
                                 (tuple(leaves[1].shape), dtype, leaves[1].device), (bool(count), bool(count)), cfg)
    grads = [g for g in grads if g is not None]
    grads_ref = torch.autograd.grad(out_ref, ref, [c.double() for c in cots])
    for g, leaf in zip(grads, leaves):
        assert g.dtype == leaf.dtype and g.shape == leaf.shape
    out = (key, value, v_enter, k_sum, v_sum)
    return out, grads, (*out_ref[:2], enter_ref, *out_ref[3:]), grads_ref


PREP_CASES = [  # (T, K, V, count, tile_elems, dtype)
    (1, 16, 32, 0, 4096, torch.float32),
    (63, 32, 16, 0, 256, torch.float32),
    (64, 16, 16, 7, 256, torch.float32),
    (100, 24, 40, 3, 512, torch.float32),  # feature blocks past K, V: masked columns
    (130, 32, 32, 0, 256, torch.float16),  # three chunks of entering sums, 16-row tiles
    (200, 16, 48, 5, 8192, torch.float16),  # 16-bit: the fwd_by_dot cases take 64-row tiles
    (200, 16, 16, 5, 8192, torch.float32),  # a tile of 256 rows opens four chunks
    (70, 80, 72, 2, 4096, torch.float32),  # five 16-wide feature blocks of K and of V, V's last partial
]


# The switches on: every 16-bit case, and one fp32 case, whose scans must ignore them (an fp32
# key, value or dx keeps every bit)
@pytest.mark.parametrize(("T", "K", "V", "count", "tile_elems", "dtype", "by_dot"),
                         [(*case, False) for case in PREP_CASES]
                         + [(*case, True) for case in PREP_CASES if case[-1] != torch.float32 or case[0] == 100])
def test_prep_matches_loop(launch, bf16_dots, T, K, V, count, tile_elems, dtype, by_dot):
    """prep_fwd / prep_bwd against running_means_loop: outputs and gradients, the in-tile sums
    by tl.cumsum or, for 16-bit inputs, on the tensor cores (PrepLaunch.fwd_by_dot and
    bwd_by_dot; the backward's fp32 terms in two bf16 parts, hence bf16_dots)."""
    launch(linearized_softmax_gdn={"prep": {"tile_elems": tile_elems, "fwd_by_dot": by_dot, "bwd_by_dot": by_dot}})
    leaves = prep_leaves(2, T, 2, K, V, count, seed=T + count)
    out, grads, out_ref, grads_ref = run_prep(leaves, count, dtype, settings("linearized_softmax_gdn").prep)
    if T == 1 and not count:  # t = 1 of an empty state: key and value exactly zero
        assert not out[0].any() and not out[1].any()
    assert_prep_within(prep_errors(out, grads, out_ref, grads_ref), TOL[dtype], ROW_TOL[dtype])


@pytest.mark.parametrize(("T", "K", "V", "count", "dtype", "by_dot", "segment_rows", "tile_elems"), [
    (200, 16, 48, 5, torch.float32, False, 64, 1024),  # four segments of one 64-row tile, the last partial
    (200, 16, 48, 0, torch.float16, True, 64, 8192),  # 64-row tiles on the tensor cores
    (130, 32, 32, 3, torch.float16, False, 64, 256),  # 16-row tiles, four a segment
    (300, 24, 40, 2, torch.float32, False, 128, 512),  # masked feature blocks, three segments
    (64, 16, 16, 7, torch.float32, False, 64, 4096),  # T = segment_rows: one segment
])
def test_prep_in_segments_matches_loop(launch, bf16_dots, monkeypatch, T, K, V, count, dtype, by_dot,
                                       segment_rows, tile_elems):
    """PrepLaunch.segment_rows: the scans in segments, each starting from the sums of the
    segments before it (after it, backward), against running_means_loop: outputs (the
    entering sums of v across segment boundaries, the final sums from the last segment) and
    gradients (ds0 from the first); the launches run the segments asked for."""
    from tests.launch_util import LaunchSpy

    grids = []
    for name in ("running_mean_fwd_kernel", "running_mean_bwd_kernel", "segment_sums_kernel"):
        monkeypatch.setattr(triton_prep, name, LaunchSpy(getattr(triton_prep, name),
                                                         lambda kw, name=name: grids.append((name, kw["SEG_T"]))))
    launch(linearized_softmax_gdn={"prep": {"tile_elems": tile_elems, "fwd_by_dot": by_dot, "bwd_by_dot": by_dot,
                                            "segment_rows": segment_rows}})
    leaves = prep_leaves(2, T, 2, K, V, count, seed=T + count + 1)
    out, grads, out_ref, grads_ref = run_prep(leaves, count, dtype, settings("linearized_softmax_gdn").prep)
    assert_prep_within(prep_errors(out, grads, out_ref, grads_ref), TOL[dtype], ROW_TOL[dtype])
    split = T > segment_rows
    assert {name for name, _ in grids} == {"running_mean_fwd_kernel", "running_mean_bwd_kernel",
                                           *(["segment_sums_kernel"] if split else [])}
    if split:
        assert {seg for _, seg in grids} == {segment_rows}
    with pytest.raises(ValueError, match="segment_rows must be 0"):
        launch(linearized_softmax_gdn={"prep": {"segment_rows": 96}})


@pytest.mark.parametrize(("T", "V", "count", "dtype", "by_dot", "segment_rows"), [
    (130, 32, 3, torch.float32, False, 0),
    (200, 48, 5, torch.float16, True, 0),  # 64-row tiles on the tensor cores
    (200, 40, 0, torch.float16, False, 64),  # four segments, the last partial
])
def test_prep_stores_the_running_mean_whole(launch, T, V, count, dtype, by_dot, segment_rows):
    """prep_fwd(store_mean=True) (LinGdnLaunch.mean_form "stored"): the scan of v writes the
    running mean vbar_t [B, T, H, V] in v's dtype in place of the entering sums, against
    running_means_loop's; key, value and the final sums as without it."""
    launch(linearized_softmax_gdn={"prep": {"fwd_by_dot": by_dot, "segment_rows": segment_rows}})
    cfg = settings("linearized_softmax_gdn").prep
    k, v, *sums = prep_leaves(2, T, 2, 16, V, count, seed=T + V)
    k, v = k.to(dtype), v.to(dtype)
    sums = sums if count else [None, None]
    key, value, v_bar, k_sum, v_sum = triton_prep.prep_fwd(k, v, *sums, count, cfg, store_mean=True)
    plain = triton_prep.prep_fwd(k, v, *sums, count, cfg)
    ref = running_means_loop(k.double(), v.double(), *(x.double() if x is not None else None for x in sums), count)
    assert v_bar.dtype == dtype and v_bar.shape == v.shape
    assert rel_err(v_bar, ref[2]) < TOL[dtype] and row_err(v_bar, ref[2]) < ROW_TOL[dtype]
    for a, b in zip((key, value, k_sum, v_sum), (plain[0], plain[1], plain[3], plain[4])):
        assert torch.equal(a, b)


def test_prep_segments_only_up_to_segment_max_heads():
    """PrepLaunch.segment_max_heads: sequences longer than segment_rows are scanned in segments
    only where B * H is at most that many; 0 lifts the limit; a negative count is an error."""
    from kernels.common.launch import PrepLaunch

    cfg = PrepLaunch(segment_rows=2048, segment_max_heads=64)
    assert [cfg.segments_at(n, 32768) for n in (32, 64, 128)] == [True, True, False]
    assert not cfg.segments_at(32, 2048)  # one segment's rows: nothing to split
    assert triton_prep.launch_blocks(64, 128, 32768, cfg, True)[2:] == (16, 2048)
    assert triton_prep.launch_blocks(128, 128, 32768, cfg, True)[2] == 1
    assert PrepLaunch(segment_rows=2048).segments_at(4096, 32768)
    with pytest.raises(ValueError, match="segment_max_heads must be >= 0"):
        PrepLaunch(segment_max_heads=-1)


@pytest.mark.parametrize(("count", "dt"), [(0, torch.float64), (7, torch.float64), (7, torch.float32)])
def test_running_mean_torch_matches_loop(count, dt):
    """running_mean_torch (the preprocessing of fp64 inputs, cumulative sums) against
    running_means_loop: outputs and gradients, with key/value kept in fp64 (to fp64's
    bound) and in fp32 as the op runs it for fp64 inputs (fp32's)."""
    leaves = prep_leaves(2, 70, 2, 16, 24, count, seed=40 + count)
    ours = [x.double().requires_grad_(True) for x in leaves]
    ref = [x.double().requires_grad_(True) for x in leaves]
    state, state_ref = (ours[2:], ref[2:]) if count else ([None, None], [None, None])
    out = triton_prep.running_mean_torch(*ours[:2], *state, count, torch.float64, dt)
    out_ref = running_means_loop(*ref[:2], *state_ref, count)
    assert [x.dtype for x in out] == [dt, dt] + [torch.float64] * 3
    gen = torch.Generator().manual_seed(98)
    cots = [torch.randn(x.shape, generator=gen, dtype=torch.float64) for x in out_ref]
    grads = torch.autograd.grad(out, ours, [c.to(x.dtype) for c, x in zip(cots, out)])
    grads_ref = torch.autograd.grad(out_ref, ref, cots)
    assert_prep_within(prep_errors(out, grads, out_ref, grads_ref), TOL[dt], ROW_TOL[dt])


@pytest.mark.parametrize("widened", [False, True], ids=["interpreter", "bf16_dots"])
def test_backward_scan_splits_into_bf16_only_where_products_are_bf16(monkeypatch, request, widened):
    """PrepLaunch.bwd_by_dot (on by default) splits the backward's fp32 cotangents into bf16
    parts for the tensor cores; the interpreter multiplies bf16 as its uint16 storage, so
    there (kernels.common.triton.utils.bf16_products false) the scan runs instead, unless
    the bf16_dots fixture widens the parts as a GPU would. Either way dk, dv match the loop."""
    from tests.launch_util import LaunchSpy

    if widened:
        request.getfixturevalue("bf16_dots")
    flags = []
    monkeypatch.setattr(triton_prep, "running_mean_bwd_kernel",
                        LaunchSpy(triton_prep.running_mean_bwd_kernel, lambda kw: flags.append(kw["BY_DOT"])))
    cfg = settings("linearized_softmax_gdn").prep
    assert cfg.bwd_by_dot
    gen = torch.Generator().manual_seed(17)
    leaves = [torch.randn(1, 100, 2, 16, generator=gen), torch.randn(1, 100, 2, 32, generator=gen)]
    out, grads, out_ref, grads_ref = run_prep(leaves, 0, torch.float16, cfg)
    assert flags == [widened, widened]
    for name, a, b in zip(("dk", "dv"), grads, grads_ref):
        assert rel_err(a, b) < TOL[torch.float16], name
