"""Triton delta rule and gated delta rule against the per-token reference (fp64), on the CPU
interpreter (conftest sets TRITON_INTERPRET=1 and NaN-poisons every buffer the kernels write).

Outputs, final states and the gradients of q, k, v, beta, g and the initial state; T in
{1, 63, 64, 100} (a partial chunk, exactly one, more than one); fp32 and fp16 inputs; beta
near 0 and 1, gates near 0 and very negative, unnormalised keys within beta ||k||^2 <= 2.
Shapes are tiny: the interpreter runs every program in Python."""

from __future__ import annotations

import pytest
import torch

from kernels import delta_rule, gated_delta_rule
from tests.launch_util import DELTA_OPS, each
from tests.util import TOL, rel_err


def make_inputs(B, T, H, K, V, dtype, seed, gated=True, with_state=True):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    v = torch.randn(B, T, H, V, generator=gen)
    beta = torch.rand(B, T, H, generator=gen) * 0.9 + 0.1
    tensors = {"q": q.to(dtype), "k": k.to(dtype), "v": v.to(dtype)}
    if gated:
        tensors["g"] = torch.nn.functional.logsigmoid(torch.randn(B, T, H, generator=gen) + 3.0)
    tensors["beta"] = beta
    h0 = torch.randn(B, H, K, V, generator=gen) if with_state else None
    return tensors, h0


@pytest.mark.parametrize(
    "B, T, H, K, V, with_state",
    [
        (1, 1, 2, 16, 16, True),
        (1, 63, 1, 16, 32, False),
        (2, 64, 1, 32, 16, True),
        (1, 100, 2, 32, 32, True),
    ],
)
def test_gated_matches_reference_fp32(compare, B, T, H, K, V, with_state):
    tensors, h0 = make_inputs(B, T, H, K, V, torch.float32, seed=T, with_state=with_state)
    compare(gated_delta_rule, tensors, h0, TOL[torch.float32])


@pytest.mark.parametrize("B, T, H, K, V", [(1, 100, 1, 32, 16), (1, 63, 2, 16, 16)])
def test_ungated_matches_reference_fp32(compare, B, T, H, K, V):
    tensors, h0 = make_inputs(B, T, H, K, V, torch.float32, seed=T + 1, gated=False)
    compare(delta_rule, tensors, h0, TOL[torch.float32])


def test_gated_fp16(compare):
    tensors, h0 = make_inputs(1, 100, 1, 32, 16, torch.float16, seed=5)
    compare(gated_delta_rule, tensors, h0, TOL[torch.float16])


def test_extreme_beta_and_gates(compare):
    """beta near 0 and exactly 1; head 0 with gates near 0, head 1 very negative (decay
    e^-20 per token), so within a chunk gamma spans hundreds of nats."""
    tensors, h0 = make_inputs(1, 100, 2, 16, 16, torch.float32, seed=9)
    gen = torch.Generator().manual_seed(10)
    pick = torch.rand(1, 100, 2, generator=gen) < 0.5
    tensors["beta"] = torch.where(pick, 1e-4, 1.0)
    g = torch.empty(1, 100, 2)
    g[..., 0] = -1e-5 * torch.rand(1, 100, generator=gen)
    g[..., 1] = -5.0 - 15.0 * torch.rand(1, 100, generator=gen)
    tensors["g"] = g
    compare(gated_delta_rule, tensors, h0, TOL[torch.float32])


def test_unnormalised_keys(compare):
    """Keys of norm up to sqrt(2 / beta): the stability limit beta ||k||^2 <= 2."""
    tensors, h0 = make_inputs(1, 64, 1, 16, 16, torch.float32, seed=12, gated=False)
    gen = torch.Generator().manual_seed(13)
    norm_sq = 0.5 + 1.4 * torch.rand(1, 64, 1, generator=gen)  # beta ||k||^2 in [0.5, 1.9]
    tensors["k"] = tensors["k"] * (norm_sq / tensors["beta"]).sqrt()[..., None]
    compare(delta_rule, tensors, h0, TOL[torch.float32])


def test_gradients_through_output_only():
    """No final state asked and no initial state: the backward runs without either."""
    tensors, _ = make_inputs(1, 70, 1, 16, 16, torch.float32, seed=14, with_state=False)
    ours = {n: t.clone().requires_grad_(True) for n, t in tensors.items()}
    ref = {n: t.double().requires_grad_(True) for n, t in tensors.items()}
    o, ht = gated_delta_rule(**ours, backend="triton")
    o_ref, _ = gated_delta_rule(**ref, backend="reference")
    assert ht is None
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(15), dtype=o.dtype)  # seeded: reproducible
    grads = torch.autograd.grad(o, list(ours.values()), do)
    grads_ref = torch.autograd.grad(o_ref, list(ref.values()), do.double())
    assert rel_err(o, o_ref) < TOL[torch.float32]
    for name, grad, grad_ref in zip(ours, grads, grads_ref):
        assert rel_err(grad, grad_ref) < TOL[torch.float32], name


def test_bad_arguments_raise():
    tensors, _ = make_inputs(1, 8, 1, 16, 16, torch.float32, seed=0)
    with pytest.raises(ValueError, match="chunk_size"):
        gated_delta_rule(**tensors, backend="triton", chunk_size=32)
    big = {**tensors, "q": torch.randn(1, 8, 1, 320), "k": torch.randn(1, 8, 1, 320)}
    with pytest.raises(ValueError, match="K, V <= 256"):
        gated_delta_rule(**big, backend="triton")


def test_fp64_inputs_computed_in_fp32():
    """float64 inputs run in float32 (the kernels' widest type) and come back as float64."""
    tensors, h0 = make_inputs(1, 20, 1, 16, 16, torch.float64, seed=15)
    tensors["beta"], tensors["g"] = tensors["beta"].double(), tensors["g"].double()
    o, ht = gated_delta_rule(**tensors, initial_state=h0.double(), output_final_state=True, backend="triton")
    o_ref, ht_ref = gated_delta_rule(**tensors, initial_state=h0.double(), output_final_state=True, backend="reference")
    assert o.dtype == torch.float64 and ht.dtype == torch.float64
    assert rel_err(o, o_ref) < TOL[torch.float32] and rel_err(ht, ht_ref) < TOL[torch.float32]


@pytest.mark.parametrize("gated", [True, False], ids=["gdn", "deltanet"])
@pytest.mark.parametrize("T", [1, 100])
def test_fused_state_output_matches_reference(compare, launch, gated, T):
    """The forward with the output fused into the state pass (DeltaLaunch.fused_fwd, on
    from 256 sequences of heads) forced on: outputs, final states and every gradient."""
    launch(**each(DELTA_OPS, {"fused_fwd": {"enabled": True, "min_heads": 1}}))
    tensors, h0 = make_inputs(1, T, 2, 32, 16, torch.float32, seed=40 + T, gated=gated)
    compare(gated_delta_rule if gated else delta_rule, tensors, h0, TOL[torch.float32])


def test_fused_state_output_equals_two_kernels():
    """Bit for bit where it can be: the same states and U; outputs up to summation order."""
    from kernels.gated_delta_rule import triton_fwd, triton_wy

    tensors, h0 = make_inputs(2, 130, 1, 32, 32, torch.float16, seed=44)  # no bf16 dots in the interpreter
    q, k, v = (tensors[n].contiguous() for n in ("q", "k", "v"))
    gam, _, w, u0 = triton_wy.wy_fwd(k, v, tensors["beta"].contiguous(), tensors["g"].contiguous())
    h, u, ht, o = triton_fwd.state_fwd(k, w, u0, gam, h0, True, q, 0.3)
    h2, u2, ht2, none = triton_fwd.state_fwd(k, w, u0, gam, h0, True)
    o2 = triton_fwd.output_fwd(q, k, u2, h2, gam, 0.3)
    assert none is None
    assert torch.equal(h, h2) and torch.equal(u, u2) and torch.equal(ht, ht2)
    assert rel_err(o, o2) < 1e-3


@pytest.mark.parametrize("gated", [True, False], ids=["gdn", "deltanet"])
@pytest.mark.parametrize("T, V", [(1, 16), (100, 32), (130, 64)])
def test_local_du_matches_reference(compare, launch, gated, T, V):
    """The backward state pass forming dU_local itself (StateBwdLaunch.local_du; GDN's
    default takes it at K <= 64 only) forced on: every gradient against the reference, with one
    V-block and (V = 64 at 16-column tiles) several, each forming the same P^T."""
    local = {"state_bwd": {"local_du": True, "min_heads": 1, "max_K": 256, "BV": 16 if V == 64 else 64}}
    launch(**each(DELTA_OPS, local))
    tensors, h0 = make_inputs(1, T, 2, 32, V, torch.float32, seed=60 + T, gated=gated)
    compare(gated_delta_rule if gated else delta_rule, tensors, h0, TOL[torch.float32])


@pytest.mark.parametrize("local", [True, False], ids=["local_du", "du_local"])
@pytest.mark.parametrize("gated", [True, False], ids=["gdn", "deltanet"])
@pytest.mark.parametrize("T, V", [(1, 16), (130, 64)])
def test_row_factors_on_v_match_reference(compare, launch, monkeypatch, gated, local, T, V):
    """The backward state pass with its row factors on the dO tile and the Kd dS product
    (StateBwdLaunch.factors_on_v; GDN's default): every gradient against the reference, one
    V-block or (V = 64 at 16-column tiles) several. Where the pass forms dU_local the factors
    stay on q and k (the launch says so)."""
    from kernels.gated_delta_rule import triton_bwd
    from tests.launch_util import LaunchSpy

    seen = []
    monkeypatch.setattr(triton_bwd, "state_bwd_kernel",
                        LaunchSpy(triton_bwd.state_bwd_kernel, lambda kw: seen.append(kw["FACTORS_ON_V"])))
    over = {"state_bwd": {"factors_on_v": True, "local_du": local, "min_heads": 1, "max_K": 256,
                          "BV": 16 if V == 64 else 64}}
    launch(**each(DELTA_OPS, over))
    tensors, h0 = make_inputs(1, T, 2, 32, V, torch.float32, seed=70 + T, gated=gated)
    compare(gated_delta_rule if gated else delta_rule, tensors, h0, TOL[torch.float32])
    assert seen and all(on == (not local) for on in seen), seen


@pytest.mark.parametrize("gated", [True, False], ids=["gdn", "deltanet"])
def test_row_factors_on_v_equal_on_qk(launch, gated):
    """fp16, 130 tokens, strong gates: dU, dh and dh0 with the factors on the V-side tiles
    against the factors on q and k, the same up to where the products round to fp16."""
    from kernels.gated_delta_rule import triton_bwd, triton_wy

    tensors, h0 = make_inputs(2, 130, 1, 32, 32, torch.float16, seed=66, gated=gated)
    q, k, v = (tensors[n].contiguous() for n in ("q", "k", "v"))
    g = 8 * tensors["g"].contiguous() if gated else None
    gam, _, w, _ = triton_wy.wy_fwd(k, v, tensors["beta"].contiguous(), g)
    gen = torch.Generator().manual_seed(67)
    do = torch.randn(2, 130, 1, 32, generator=gen).half()
    dht = torch.randn(2, 1, 32, 32, generator=gen)
    outs = {}
    for on in (False, True):
        launch(**each(DELTA_OPS, {"state_bwd": {"factors_on_v": on, "local_du": False}}))
        outs[on] = triton_bwd.state_bwd(q, k, w, do, triton_bwd.du_local(q, k, do, gam, 0.3), gam, dht, 0.3, True)
    for ours, base in zip(outs[True], outs[False]):
        assert ours.dtype == base.dtype and ours.shape == base.shape
        assert rel_err(ours.float(), base.float()) < 2e-3


@pytest.mark.parametrize("gated", [True, False], ids=["gdn", "deltanet"])
def test_local_du_equals_du_local_then_state_bwd(launch, gated):
    """state_bwd with dU_local formed in the pass against du_local's then state_bwd's: the
    same dh, dh0 and dU up to the rounding of dU_local (stored in fp16 by du_local, kept in
    fp32 in the pass); and du None with the switch off is an error naming it."""
    from kernels.gated_delta_rule import triton_bwd, triton_wy

    tensors, h0 = make_inputs(2, 130, 1, 32, 32, torch.float16, seed=64, gated=gated)
    q, k, v = (tensors[n].contiguous() for n in ("q", "k", "v"))
    gam, _, w, _ = triton_wy.wy_fwd(k, v, tensors["beta"].contiguous(), tensors["g"].contiguous() if gated else None)
    gen = torch.Generator().manual_seed(65)
    do = torch.randn(2, 130, 1, 32, generator=gen).half()
    dht = torch.randn(2, 1, 32, 32, generator=gen)
    launch(**each(DELTA_OPS, {"state_bwd": {"local_du": False}}))
    with pytest.raises(ValueError, match="local_du"):
        triton_bwd.state_bwd(q, k, w, do, None, gam, dht, 0.3, True)
    du_split, dh_split, dh0_split = triton_bwd.state_bwd(
        q, k, w, do, triton_bwd.du_local(q, k, do, gam, 0.3), gam, dht, 0.3, True)
    launch(**each(DELTA_OPS, {"state_bwd": {"local_du": True, "min_heads": 1, "max_K": 256}}))
    du, dh, dh0 = triton_bwd.state_bwd(q, k, w, do, None, gam, dht, 0.3, True)
    for ours, split in ((du, du_split), (dh, dh_split), (dh0, dh0_split)):
        assert ours.dtype == split.dtype and ours.shape == split.shape
        assert rel_err(ours.float(), split.float()) < 2e-3


@pytest.mark.parametrize("readback", [True, False])
@pytest.mark.parametrize("gated", [True, False], ids=["gdn", "deltanet"])
@pytest.mark.parametrize("T, K, dtype", [(1, 16, torch.float32), (130, 32, torch.float32), (100, 64, torch.float16)])
def test_wy_bwd_readback_matches_reference(compare, launch, gated, T, K, dtype, readback):
    """The WY backward with dM^T read back transposed from a scratch copy of dM (WyBwdLaunch.
    dm_readback, the default) and formed again from transposed products: every gradient
    against the reference; a partial last chunk, several chunks, fp16 (dM rounded to it as
    the other path rounds its transpose)."""
    launch(**each(DELTA_OPS, {"wy_bwd": {"dm_readback": readback}}))
    tensors, h0 = make_inputs(2, T, 2, K, 32, dtype, seed=70 + T, gated=gated)
    compare(gated_delta_rule if gated else delta_rule, tensors, h0, TOL[dtype])


@pytest.mark.parametrize("sixteen", [True, False], ids=["share16", "share32"])
@pytest.mark.parametrize("gated", [True, False], ids=["gdn", "deltanet"])
@pytest.mark.parametrize("T, K, dtype", [(130, 32, torch.float16), (100, 64, torch.float16), (65, 32, torch.float32)])
def test_dk_part_in_16_bits_matches_reference(compare, launch, monkeypatch, gated, T, K, dtype, sixteen):
    """dqkw storing dk's share from the output and the state in the input dtype
    (DqkwLaunch.dk_part_16bit: DeltaNet's default) for 16-bit inputs, fp32 for fp32 inputs,
    or in fp32 throughout: every gradient against the reference; a partial last chunk,
    several chunks; wy_bwd is handed the share in the dtype asked for."""
    from kernels.gated_delta_rule import triton_op

    seen = []
    wy_bwd = triton_op.wy_bwd
    monkeypatch.setattr(triton_op, "wy_bwd", lambda *a, **kw: seen.append(a[7].dtype) or wy_bwd(*a, **kw))
    launch(**each(DELTA_OPS, {"dqkw": {"dk_part_16bit": sixteen}}))
    tensors, h0 = make_inputs(2, T, 2, K, 32, dtype, seed=90 + T, gated=gated)
    compare(gated_delta_rule if gated else delta_rule, tensors, h0, TOL[dtype])
    assert seen and set(seen) == {dtype if sixteen else torch.float32}


def assert_gate_without_gradient_agrees(launch, tensors: dict, h0, tol: float, variant: dict, baseline: dict) -> None:
    """GDN's gradients where the gate wants none (lin_gdn's gates come from positions: the
    kernels then skip the d gamma shares) under the delta rules' launch changes `variant`,
    each within tol of those under `baseline`."""
    grads = []
    for changes in (variant, baseline):
        launch(**each(DELTA_OPS, changes))
        leaves = {n: t.detach().clone().requires_grad_(n != "g") for n, t in tensors.items()}
        o, _ = gated_delta_rule(**leaves, initial_state=h0, backend="triton")
        o.float().square().sum().backward()
        grads.append({n: t.grad for n, t in leaves.items() if n != "g"})
    for name, grad in grads[0].items():
        assert rel_err(grad.float(), grads[1][name].float()) < tol, name


@pytest.mark.parametrize("gated", [True, False], ids=["gdn", "deltanet"])
@pytest.mark.parametrize("K, BK, dtype", [(128, 64, torch.float32), (100, 32, torch.float16), (48, 16, torch.float32)])
def test_dqkw_k_loop_matches_reference(compare, launch, monkeypatch, gated, K, BK, dtype):
    """dqkw with one program a chunk walking the K-blocks (DqkwLaunch.k_loop) where K spans
    two to four of them, a partial last K-block (100 = 3 x 32 + 4) and a partial last chunk:
    every gradient, dg's per-block shares summed in the kernel included, against the
    reference, and with a gate that wants no gradient against the per-block kernel; the
    k-loop kernel is the one launched, and dqkw_kernel where K fits one block."""
    from kernels.gated_delta_rule import triton_bwd_grad
    from tests.launch_util import LaunchSpy

    seen = []
    for name in ("dqkw_kernel", "dqkw_k_loop_kernel"):
        monkeypatch.setattr(triton_bwd_grad, name,
                            LaunchSpy(getattr(triton_bwd_grad, name), lambda kw, name=name: seen.append(name)))
    launch(**each(DELTA_OPS, {"dqkw": {"BK": BK, "k_loop": True}}))
    tensors, h0 = make_inputs(1, 130, 2, K, 32, dtype, seed=130 + K, gated=gated)
    compare(gated_delta_rule if gated else delta_rule, tensors, h0, TOL[dtype])
    assert seen and set(seen) == {"dqkw_k_loop_kernel"}
    if gated:
        assert_gate_without_gradient_agrees(launch, tensors, h0, TOL[dtype], {"dqkw": {"BK": BK, "k_loop": True}},
                                            {"dqkw": {"BK": BK, "k_loop": False}})
    seen.clear()
    launch(**each(DELTA_OPS, {"dqkw": {"BK": 64, "k_loop": True}}))
    tensors, h0 = make_inputs(1, 70, 2, 64, 32, dtype, seed=131, gated=gated)
    compare(gated_delta_rule if gated else delta_rule, tensors, h0, TOL[dtype])
    assert seen and set(seen) == {"dqkw_kernel"}


@pytest.mark.parametrize("gated", [True, False], ids=["gdn", "deltanet"])
@pytest.mark.parametrize("K, BK, V, dtype", [(128, 64, 64, torch.float32), (100, 32, 96, torch.float16),
                                             (48, 16, 64, torch.float32)])
def test_dqkw_fused_with_wy_bwd_matches_reference(compare, launch, monkeypatch, gated, K, BK, V, dtype):
    """dqkw and the WY backward as one kernel a chunk (DqkwLaunch.fuse_wy_bwd), over one to
    four K-blocks (a partial one at K = 100) and V-blocks (a partial one at V = 96), a partial
    last chunk: every gradient against the reference, and with a gate that wants no gradient
    against the two launches; the fused kernel runs alone, and under V = 64 (where wy_bwd takes
    2 warps) the two launches run instead."""
    from kernels.gated_delta_rule import triton_bwd_fused, triton_bwd_grad, triton_wy_bwd
    from tests.launch_util import LaunchSpy

    seen = []
    for module, name in ((triton_bwd_fused, "dqkw_wy_bwd_kernel"), (triton_bwd_grad, "dqkw_kernel"),
                         (triton_bwd_grad, "dqkw_k_loop_kernel"), (triton_wy_bwd, "wy_bwd_kernel")):
        monkeypatch.setattr(module, name, LaunchSpy(getattr(module, name), lambda kw, name=name: seen.append(name)))
    fused = {"dqkw": {"BK": BK, "fuse_wy_bwd": True}, "wy_bwd": {"BK": BK, "BV": 32}}
    launch(**each(DELTA_OPS, fused))
    tensors, h0 = make_inputs(1, 130, 2, K, V, dtype, seed=150 + K, gated=gated)
    compare(gated_delta_rule if gated else delta_rule, tensors, h0, TOL[dtype])
    assert seen and set(seen) == {"dqkw_wy_bwd_kernel"}
    if gated:
        assert_gate_without_gradient_agrees(launch, tensors, h0, TOL[dtype], {"dqkw": {"fuse_wy_bwd": True}},
                                            {"dqkw": {"fuse_wy_bwd": False}})
    seen.clear()
    launch(**each(DELTA_OPS, fused))
    tensors, h0 = make_inputs(1, 70, 2, K, 32, dtype, seed=151, gated=gated)
    compare(gated_delta_rule if gated else delta_rule, tensors, h0, TOL[dtype])
    assert "dqkw_wy_bwd_kernel" not in seen and "wy_bwd_kernel" in seen


@pytest.mark.parametrize("gated", [True, False], ids=["gdn", "deltanet"])
@pytest.mark.parametrize("K, dtype", [(32, torch.float16), (64, torch.float32), (100, torch.float32)])
def test_dqkw_narrow_value_blocks_match_reference(compare, launch, monkeypatch, gated, K, dtype):
    """dqkw with its V-block capped at 16 columns up to head dim 64 (DqkwLaunch.narrow_BV;
    V = 64 then takes four blocks) and at BV above it: every gradient against the reference,
    a partial last chunk; the kernel is launched with the block asked for."""
    from kernels.gated_delta_rule import triton_bwd_grad
    from tests.launch_util import LaunchSpy

    seen = []
    monkeypatch.setattr(triton_bwd_grad, "dqkw_kernel",
                        LaunchSpy(triton_bwd_grad.dqkw_kernel, lambda kw: seen.append(kw["BV"])))
    launch(**each(DELTA_OPS, {"dqkw": {"BV": 64, "narrow_BV": 16}}))
    tensors, h0 = make_inputs(1, 130, 2, K, 64, dtype, seed=110 + K, gated=gated)
    compare(gated_delta_rule if gated else delta_rule, tensors, h0, TOL[dtype])
    assert seen and set(seen) == {16 if K <= 64 else 64}
    with pytest.raises(ValueError, match=r"DqkwLaunch.narrow_BV must be one of \[0, 16, 32"):
        launch(**each(DELTA_OPS, {"dqkw": {"narrow_BV": 48}}))


def test_wy_bwd_readback_equals_transposed_products(launch, monkeypatch):
    """dm_readback on and off on the same inputs, the kernel alone: dk, dv, dbeta and dg agree
    up to the rounding of the two ways of forming dM^T (fp16 tiles), and the kernel was
    launched each way."""
    from kernels.gated_delta_rule import triton_wy, triton_wy_bwd
    from tests.launch_util import LaunchSpy

    flags = []
    monkeypatch.setattr(triton_wy_bwd, "wy_bwd_kernel",
                        LaunchSpy(triton_wy_bwd.wy_bwd_kernel, lambda kw: flags.append(kw["DM_READBACK"])))
    tensors, _ = make_inputs(2, 130, 1, 32, 32, torch.float16, seed=71)
    k, v, beta, g = (tensors[n].contiguous() for n in ("k", "v", "beta", "g"))
    gam, tm, _, _ = triton_wy.wy_fwd(k, v, beta, g)
    gen = torch.Generator().manual_seed(72)
    dw, dk_part = (torch.randn(k.shape, generator=gen).half() for _ in range(2))
    du = torch.randn(v.shape, generator=gen).half()
    dgam_part = torch.randn(2, *beta.shape, generator=gen)
    launch(**each(DELTA_OPS, {"wy_bwd": {"dm_readback": False}}))
    products = triton_wy_bwd.wy_bwd(k, v, beta, gam, tm, dw, du, dk_part, dgam_part, torch.float32)
    launch(**each(DELTA_OPS, {"wy_bwd": {"dm_readback": True}}))
    readback = triton_wy_bwd.wy_bwd(k, v, beta, gam, tm, dw, du, dk_part, dgam_part, torch.float32)
    assert flags == [False, True]
    for name, a, b in zip(("dk", "dv", "dbeta", "dg"), readback, products):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert rel_err(a.float(), b.float()) < 2e-3, name


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_wide_keys_narrow_values(compare, dtype):
    """K = 256, V = 32, the tiles of the H200 case gdn_bf16_T1000_K256_V32
    (tests/gpu/test_delta_gpu.py): the state passes hold a 256 x 32 block, dqkw and wy_bwd
    loop over four 64-wide K-blocks (four dgam partials) and V fits one 32-wide block; the
    launch choices are the GPU's, since none of them depends on the device at V = 32."""
    tensors, h0 = make_inputs(1, 130, 1, 256, 32, dtype, seed=50)
    compare(gated_delta_rule, tensors, h0, TOL[dtype])


@pytest.mark.parametrize(
    "B, T, H, K, V, tiles",
    [(1, 130, 1, 256, 32, False), (2, 100, 2, 32, 32, True)],
    ids=["K256_V32", "K32_V32_tiles16"],
)
def test_backward_stages(launch, B, T, H, K, V, tiles):
    """Each kernel of the pipeline against its own formulas on the tensors it read
    (tests/delta_stages.py): the same check tests/gpu/test_delta_stages_gpu.py runs on a GPU,
    where it names the kernel that goes wrong. tiles: every tile cap 16 (several K- and
    V-blocks in every loop)."""
    from kernels.common.launch import settings
    from tests.delta_stages import stage_errors
    from tests.launch_util import small_tiles

    if tiles:
        launch(gated_delta_rule=small_tiles(settings("gated_delta_rule")))
    tensors, h0 = make_inputs(B, T, H, K, V, torch.float32, seed=51)
    gen = torch.Generator().manual_seed(52)
    do = torch.randn(B, T, H, V, generator=gen)
    dht = torch.randn(B, H, K, V, generator=gen)
    errors = stage_errors(tensors["q"], tensors["k"], tensors["v"], tensors["g"], tensors["beta"], h0, do, dht,
                          K**-0.5)
    bad = {name: err for name, err in errors.items() if not err < TOL[torch.float32]}
    assert not bad, f"kernel outputs over {TOL[torch.float32]:g}: {bad} (all: {errors})"


def test_gate_without_gradient_skips_dg_only():
    """A gate that wants no gradient (the linearized softmax GDN's, from positions): the
    kernels skip dg, and every other gradient is bit for bit the one with dg computed."""
    tensors, h0 = make_inputs(1, 100, 2, 32, 16, torch.float32, seed=16)
    do = torch.randn(1, 100, 2, 16, generator=torch.Generator().manual_seed(17))
    grads = {}
    for g_grad in (True, False):
        leaves = {n: t.clone().requires_grad_(n != "g" or g_grad) for n, t in {**tensors, "h0": h0}.items()}
        h0_leaf = leaves.pop("h0")
        o, _ = gated_delta_rule(**leaves, initial_state=h0_leaf, backend="triton")
        wrt = [t for t in (*leaves.values(), h0_leaf) if t.requires_grad]
        grads[g_grad] = dict(zip([n for n, t in {**leaves, "h0": h0_leaf}.items() if t.requires_grad],
                                 torch.autograd.grad(o, wrt, do)))
    assert "g" in grads[True] and "g" not in grads[False]
    for name, grad in grads[False].items():
        assert torch.equal(grad, grads[True][name]), name


HEADS_FIRST_KERNELS = ("wy_fwd_kernel", "wy_bwd_kernel", "dqkw_kernel", "du_local_kernel", "output_fwd_kernel")


@pytest.mark.parametrize("gated", [True, False], ids=["gdn", "deltanet"])
def test_heads_first_grid_equals_chunks_first(launch, monkeypatch, gated):
    """DeltaLaunch.heads_first: the kernels parallel over chunks launched with the sequences of
    heads on the faster grid axis give the output, the final state and every gradient bit for
    bit as with the chunks first (the same programs in another order), over several chunks and
    sequences of heads; each of those kernels is launched with the order asked for, always
    (heads_first) or from heads_first_from_chunks chunks a sequence on (here 3 chunks: on at
    3, off at 4; the forward's output and dU_local in kernels of their own here, so that all
    five run)."""
    import importlib

    from tests.launch_util import LaunchSpy

    modules = {name: importlib.import_module(f"kernels.gated_delta_rule.{name}")
               for name in ("triton_wy", "triton_wy_bwd", "triton_bwd_grad", "triton_bwd", "triton_fwd")}
    seen = []
    for module in modules.values():
        for name in HEADS_FIRST_KERNELS:
            if hasattr(module, name):
                monkeypatch.setattr(module, name, LaunchSpy(getattr(module, name),
                                                            lambda kw, name=name: seen.append((name, kw["HEADS_FIRST"]))))
    op = gated_delta_rule if gated else delta_rule
    tensors, h0 = make_inputs(2, 150, 3, 32, 16, torch.float32, seed=150, gated=gated)
    # the launch fixture's overrides stack, so every order names both settings
    orders = {False: {"heads_first": False, "heads_first_from_chunks": 0},
              True: {"heads_first": True, "heads_first_from_chunks": 0},
              "from 3": {"heads_first": False, "heads_first_from_chunks": 3},
              "from 4": {"heads_first": False, "heads_first_from_chunks": 4}}
    runs = {}
    for label, order in orders.items():
        seen.clear()
        launch(**each(DELTA_OPS, {**order, "fused_fwd": {"enabled": False}, "state_bwd": {"local_du": False}}))
        leaves = {n: t.clone().requires_grad_(True) for n, t in tensors.items()}
        state = h0.clone().requires_grad_(True)
        o, ht = op(**leaves, initial_state=state, output_final_state=True, backend="triton")
        grads = torch.autograd.grad((o, ht), [*leaves.values(), state], (torch.ones_like(o), torch.ones_like(ht)))
        runs[label] = (o, ht, *grads)
        expected = label is True or label == "from 3"
        assert sorted(set(seen)) == sorted((name, expected) for name in HEADS_FIRST_KERNELS), (label, seen)
    for label in (True, "from 3", "from 4"):
        for ours, chunks_first in zip(runs[label], runs[False]):
            assert torch.equal(ours, chunks_first), label
    with pytest.raises(ValueError, match="heads_first_from_chunks must be a count of chunks >= 0"):
        launch(**each(DELTA_OPS, {"heads_first_from_chunks": -1}))


def test_heads_first_rule_by_length():
    """heads_first_from_chunks: heads first from that many chunks a sequence on, never with 0,
    and chunks first again past the 65,535 chunks a grid's slower axis holds; heads_first
    forces the order at any length."""
    from kernels.common.launch import DeltaLaunch

    rule = DeltaLaunch(heads_first_from_chunks=256)
    assert [rule.heads_first_at(n) for n in (1, 255, 256, 512, 65_535, 65_536)] == [False, False, True, True, True, False]
    assert not DeltaLaunch().heads_first_at(512)
    assert DeltaLaunch(heads_first=True).heads_first_at(1)


def test_chunk_grid_orders_the_axes_and_refuses_too_many():
    """chunk_grid: the lead axes, then chunks and sequences of heads in the order asked for;
    an axis past the first over CUDA's 65,535 programs is an error naming what overflowed."""
    from kernels.common.triton.utils import chunk_grid

    assert chunk_grid((), 32, 512, False, "wy_fwd") == (32, 512)
    assert chunk_grid((), 32, 512, True, "wy_fwd") == (512, 32)
    assert chunk_grid((2,), 32, 512, True, "dqkw") == (2, 512, 32)
    assert chunk_grid((), 70_000, 4, False, "wy_fwd") == (70_000, 4)  # the first axis has no such limit
    with pytest.raises(ValueError, match="dqkw: 70000 chunks on grid axis 2, over CUDA's limit of 65535"):
        chunk_grid((2,), 70_000, 4, True, "dqkw")
    with pytest.raises(ValueError, match="wy_fwd: 70000 sequences of heads on grid axis 1"):
        chunk_grid((), 8, 70_000, False, "wy_fwd")
