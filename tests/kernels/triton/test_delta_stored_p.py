"""The delta rules' P stored by the training forward and read by the backward
(DeltaLaunch.store_p), or formed by wy_fwd and read by the output too (DeltaLaunch.p_in_wy),
on the CPU interpreter: every gradient against the fp64 reference on each path that stores P
(the fused state pass, over several V-blocks of which only the first stores, output_fwd, and
wy_fwd) and each that reads it (the output passes, du_local, and the backward state pass
forming dU_local itself); the stored P against P formed in torch; the same gradients as P
formed again in the backward; lin_gdn and the custom ops under it."""

from __future__ import annotations

import pytest
import torch

from kernels import delta_rule, gated_delta_rule
from tests.kernels.triton.test_delta_triton import make_inputs
from tests.launch_util import DELTA_OPS, LaunchSpy, each
from tests.util import TOL, rel_err


def _store_p(fused: bool, local: bool, V: int, in_wy: bool = False) -> dict:
    """Launch changes: P stored by the output pass (or formed by wy_fwd where in_wy) at every
    head dim, the output fused into the state pass or not, dU_local formed in the backward
    state pass or by du_local; 16-column state blocks where V = 64, so that several V-block
    programs run and only the first stores P."""
    return {"store_p": not in_wy, "p_in_wy": in_wy, "p_above_K": 0,
            "fused_fwd": {"enabled": fused, "min_heads": 1, "BV": 16 if V == 64 else 64},
            "state_bwd": {"local_du": local, "min_heads": 1, "max_K": 256}}


@pytest.mark.parametrize("in_wy", [False, True], ids=["output_stores", "wy_forms"])
@pytest.mark.parametrize("local", [True, False], ids=["local_du", "du_local"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "output_fwd"])
@pytest.mark.parametrize("gated", [True, False], ids=["gdn", "deltanet"])
@pytest.mark.parametrize("T, V", [(1, 16), (130, 64)])
def test_stored_p_matches_reference(compare, launch, monkeypatch, gated, fused, local, in_wy, T, V):
    from kernels.gated_delta_rule import triton_bwd, triton_fwd, triton_wy

    seen = []
    fwd_kernel = "state_fwd_kernel" if fused else "output_fwd_kernel"
    monkeypatch.setattr(triton_wy, "wy_fwd_kernel",
                        LaunchSpy(triton_wy.wy_fwd_kernel, lambda kw: seen.append(("wy stores", kw["STORE_P"]))))
    monkeypatch.setattr(triton_fwd, fwd_kernel, LaunchSpy(getattr(triton_fwd, fwd_kernel), lambda kw: seen.append(
        ("output stores", kw["STORE_P"])) or seen.append(("output loads", kw["LOAD_P"]))))
    bwd_kernel = "state_bwd_kernel" if local else "du_local_kernel"
    monkeypatch.setattr(triton_bwd, bwd_kernel,
                        LaunchSpy(getattr(triton_bwd, bwd_kernel), lambda kw: seen.append(("read", kw["P_STORED"]))))
    launch(**each(DELTA_OPS, _store_p(fused, local, V, in_wy)))
    tensors, h0 = make_inputs(1, T, 2, 32, V, torch.float32, seed=90 + T, gated=gated)
    if gated:
        tensors["g"] = 6 * tensors["g"]  # strong gates: P's decay far from 1
    compare(gated_delta_rule if gated else delta_rule, tensors, h0, TOL[torch.float32])
    assert sorted(seen) == [("output loads", in_wy), ("output stores", not in_wy), ("read", True),
                            ("wy stores", in_wy)], seen


@pytest.mark.parametrize("in_wy", [False, True], ids=["output_stores", "wy_forms"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "output_fwd"])
def test_stored_p_is_the_output_p(launch, fused, in_wy):
    """The P the forward stores: scale (Q K^T ⊙ 2^(gamma_i - gamma_j)), lower with the
    diagonal, chunk by chunk (row t holding row t mod 64 of its chunk), rounded to q's dtype;
    rows past T not stored, and the buffer's shape and dtype as the custom op's fake says."""
    from kernels.gated_delta_rule.triton_op import delta_rule_fwd

    launch(**each(DELTA_OPS, _store_p(fused, True, 64, in_wy)))
    tensors, h0 = make_inputs(2, 130, 1, 32, 64, torch.float16, seed=93)
    q, k, v, g, beta = (tensors[n].contiguous() for n in ("q", "k", "v", "g", "beta"))
    g = 6 * g
    p = delta_rule_fwd(q, k, v, g, beta, h0, 0.3, False)[-1]
    assert p.shape == (2, 130, 1, 64) and p.dtype == torch.float16
    gam = torch.zeros(2, 130, 1, dtype=torch.float64)
    for t0 in range(0, 130, 64):  # log2-gates summed within each chunk
        gam[:, t0:t0 + 64] = torch.cumsum(g[:, t0:t0 + 64].double(), dim=1) / torch.log(torch.tensor(2.0))
    for t0 in range(0, 130, 64):
        rows = slice(t0, min(t0 + 64, 130))
        n = rows.stop - t0
        qk = torch.einsum("bthk,bshk->bhts", q[:, rows].double(), k[:, rows].double())
        decay = torch.exp2(gam[:, rows, 0][:, :, None] - gam[:, rows, 0][:, None, :])[:, None]
        want = torch.tril(0.3 * qk * decay)
        got = p[:, rows].permute(0, 2, 1, 3)[..., :n].double()
        assert rel_err(got, want) < 1e-3
        assert torch.equal(p[:, rows, :, n:], torch.zeros_like(p[:, rows, :, n:]))  # above the diagonal


@pytest.mark.parametrize("in_wy", [False, True], ids=["output_stores", "wy_forms"])
@pytest.mark.parametrize("gated", [True, False], ids=["gdn", "deltanet"])
def test_stored_p_gives_the_gradients_of_p_formed_again(launch, gated, in_wy):
    """fp16, 130 tokens, strong gates, both paths: every gradient with P stored against P formed
    in the backward, the same up to the order of P's sums."""
    tensors, h0 = make_inputs(2, 130, 1, 32, 32, torch.float16, seed=95, gated=gated)
    if gated:
        tensors["g"] = 6 * tensors["g"]
    op = gated_delta_rule if gated else delta_rule
    grads = {}
    for store in (False, True):
        with torch.enable_grad():
            leaves = {n: t.detach().clone().requires_grad_(True) for n, t in tensors.items()}
            launch(**each(DELTA_OPS, {"store_p": store and not in_wy, "p_in_wy": store and in_wy, "p_above_K": 0,
                                      "state_bwd": {"local_du": True, "min_heads": 1, "max_K": 256}}))
            o, ht = op(**leaves, initial_state=h0, output_final_state=True, backend="triton")
            gen = torch.Generator().manual_seed(96)
            cot = (torch.randn(o.shape, generator=gen).to(o.dtype), torch.randn(ht.shape, generator=gen))
            grads[store] = [o.detach(), *torch.autograd.grad((o, ht), list(leaves.values()), cot)]
    for ours, base in zip(grads[True], grads[False]):
        assert ours.dtype == base.dtype and ours.shape == base.shape
        assert rel_err(ours.float(), base.float()) < 2e-3


@pytest.mark.parametrize("in_wy", [False, True], ids=["output_stores", "wy_forms"])
@pytest.mark.parametrize("count", [0, 6])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "output_fwd"])
def test_lin_gdn_with_stored_p_matches_its_recurrence(launch, monkeypatch, fused, count, in_wy):
    """lin_gdn runs gated_delta_rule's kernels under that op's settings, P stored there too:
    outputs, final state and every gradient against its recurrence, the running mean added in
    the pass that stores P."""
    from kernels.gated_delta_rule import triton_bwd
    from tests.kernels.triton.test_lin_gdn_triton import run_case

    read = []
    monkeypatch.setattr(triton_bwd, "state_bwd_kernel",
                        LaunchSpy(triton_bwd.state_bwd_kernel, lambda kw: read.append(kw["P_STORED"])))
    launch(gated_delta_rule=_store_p(fused, True, 16, in_wy),
           linearized_softmax_gdn={"train_fused": fused, "train_fused_max_K": 256})
    run_case(1, 130, 2, 16, 16, count, torch.float32, seed=99 + count)
    assert read == [True]


@pytest.mark.parametrize("in_wy", [False, True], ids=["output_stores", "wy_forms"])
@pytest.mark.parametrize("gated", [True, False], ids=["gdn", "deltanet"])
def test_opcheck_with_stored_p(launch, gated, in_wy):
    """The custom ops with P among the forward's outputs and the backward's inputs."""
    from kernels.gated_delta_rule.triton_op import delta_rule_fwd

    launch(**each(DELTA_OPS, _store_p(True, True, 16, in_wy)))
    tensors, h0 = make_inputs(1, 70, 2, 16, 16, torch.float32, seed=98, gated=gated)
    t = {n: x.requires_grad_() for n, x in tensors.items()}
    torch.library.opcheck(delta_rule_fwd, (t["q"], t["k"], t["v"], t.get("g"), t["beta"],
                                           h0.requires_grad_() if gated else None, 0.3, gated))


@pytest.mark.parametrize("K, kept", [(32, False), (64, False), (100, True)])
def test_p_kept_above_its_head_dim_only(compare, launch, monkeypatch, K, kept):
    """p_above_K 64 (GDN's default with p_in_wy): at head dims up to 64 wy_fwd forms no P, the
    output forms its own, the backward reads none and the custom op returns a placeholder; above
    it P travels as under p_in_wy. The gradients hold against the reference either way."""
    from kernels.gated_delta_rule import triton_fwd, triton_wy
    from kernels.gated_delta_rule.triton_op import delta_rule_fwd

    seen = []
    monkeypatch.setattr(triton_wy, "wy_fwd_kernel",
                        LaunchSpy(triton_wy.wy_fwd_kernel, lambda kw: seen.append(("wy stores", kw["STORE_P"]))))
    monkeypatch.setattr(triton_fwd, "output_fwd_kernel", LaunchSpy(
        triton_fwd.output_fwd_kernel, lambda kw: seen.append(("output loads", kw["LOAD_P"]))))
    launch(**each(DELTA_OPS, {"p_in_wy": True, "p_above_K": 64, "fused_fwd": {"enabled": False}}))
    tensors, h0 = make_inputs(1, 70, 2, K, 16, torch.float32, seed=97)
    q, k, v, g, beta = (tensors[n].contiguous() for n in ("q", "k", "v", "g", "beta"))
    p = delta_rule_fwd(q, k, v, 6 * g, beta, h0, 0.3, False)[-1]
    assert sorted(seen) == [("output loads", kept), ("wy stores", kept)], seen
    assert p.shape == ((1, 70, 2, 64) if kept else (0,)), p.shape
    tensors["g"] = 6 * tensors["g"]
    compare(gated_delta_rule, tensors, h0, TOL[torch.float32])
