"""Launch settings reach the kernels: a forward runs under the settings in effect, its
backward under the same ones wherever it runs, and a recording notes them."""

from __future__ import annotations

import importlib

import pytest
import torch

from kernels import gated_delta_rule, gated_linear_attention
from kernels.common import launch
from tests.launch_util import LaunchSpy


def _gdn_inputs(T=70, H=2, K=16, V=16):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, T, H, d, generator=gen) for d in (K, K, V))
    k = torch.nn.functional.normalize(k, dim=-1)
    g = -torch.rand(1, T, H, generator=gen)
    beta = torch.rand(1, T, H, generator=gen)
    return [t.requires_grad_(True) for t in (q, k, v, g, beta)]


def test_gdn_backward_runs_under_the_forwards_settings(monkeypatch):
    from kernels.gated_delta_rule import triton_op

    seen = []
    dqkw = triton_op.dqkw
    monkeypatch.setattr(triton_op, "dqkw", lambda *a, **kw: seen.append(launch.settings("gated_delta_rule").dqkw.BK)
                        or dqkw(*a, **kw))
    q, k, v, g, beta = _gdn_inputs()
    with launch.recording_launches() as used:
        with launch.launch_settings(gated_delta_rule={"dqkw": {"BK": 16}}):
            o, _ = gated_delta_rule(q, k, v, g, beta, backend="triton")
        o.sum().backward()  # outside the block: the forward's settings still hold
    assert seen == [16]
    assert used["gated_delta_rule"]["dqkw"]["BK"] == 16 and list(used) == ["gated_delta_rule"]
    assert torch.isfinite(q.grad).all()


def test_gla_backward_runs_under_the_forwards_settings(monkeypatch):
    from kernels.gated_linear_attention import triton_function

    seen = []
    dqk = triton_function.chunk_bwd_dqk
    monkeypatch.setattr(triton_function, "chunk_bwd_dqk",
                        lambda *a, **kw: seen.append(launch.settings("gated_linear_attention").bwd_dqk.BK) or dqk(*a, **kw))
    q, k, v, g, _ = _gdn_inputs()
    with launch.recording_launches() as used:
        with launch.launch_settings(gated_linear_attention={"bwd_dqk": {"BK": 16}}):
            o, _ = gated_linear_attention(q, k, v, g, backend="triton")
        o.sum().backward()
    assert seen == [16] and used["gated_linear_attention"]["bwd_dqk"]["BK"] == 16


@pytest.mark.parametrize("module, kernel", [("triton_wy_bwd", "wy_bwd"), ("triton_bwd", "du_local"),
                                            ("triton_fwd", "output_fwd")])
def test_narrow_value_blocks_take_narrow_warps(monkeypatch, module, kernel):
    """output_fwd, du_local and wy_bwd launch with narrow_num_warps (2) where their V-block is
    under 64 columns, the shapes where 4 warps miscompile on the H200, and with num_warps (4)
    from 64 on; a launch_settings change of narrow_num_warps reaches the launch."""
    mod = importlib.import_module(f"kernels.gated_delta_rule.{module}")
    asked, seen = [], []
    warps = mod.warps
    # Under the interpreter warps() turns every request into 1 warp: the request is read where
    # it is made, and each launch notes (its BV, the last request).
    monkeypatch.setattr(mod, "warps", lambda n: asked.append(n) or warps(n))
    monkeypatch.setattr(mod, f"{kernel}_kernel",
                        LaunchSpy(getattr(mod, f"{kernel}_kernel"), lambda kw: seen.append((kw["BV"], asked[-1]))))
    separate_du = {"state_bwd": {"local_du": False}}  # du_local runs only where the state pass does not form dU_local
    for V, bv, expected in ((16, 16, 2), (32, 32, 2), (64, 64, 4), (100, 64, 4)):
        seen.clear()
        q, k, v, g, beta = _gdn_inputs(T=40, V=V)
        with launch.launch_settings(gated_delta_rule=separate_du):
            o, _ = gated_delta_rule(q, k, v, g, beta, backend="triton")
            o.sum().backward()
        assert len(seen) == 1 and seen[0][0] >= bv and seen[0][1] == expected, (V, seen)
    seen.clear()
    with launch.launch_settings(gated_delta_rule={kernel: {"narrow_num_warps": 1}, **separate_du}):
        q, k, v, g, beta = _gdn_inputs(T=40, V=32)
        gated_delta_rule(q, k, v, g, beta, backend="triton")[0].sum().backward()
    assert seen == [(32, 1)]


def test_mesa_solves_take_narrow_warps_at_small_head_dims(monkeypatch):
    """MesaNet's forward and backward CG solves launch with narrow_num_warps (4) where the
    K-block is at most narrow_max_K (64) wide and with num_warps (8) above it (K = 100 pads to
    a 128 block); a launch_settings change of either reaches the launch."""
    from kernels import mesa
    from kernels.mesa import triton_solve

    asked, seen = [], []
    warps = triton_solve.warps
    # under the interpreter warps() turns every request into 1 warp: the request is read where
    # it is made, and each launch notes (its K-block, the last request)
    monkeypatch.setattr(triton_solve, "warps", lambda n: asked.append(n) or warps(n))
    for name in ("mesa_fwd_solve_kernel", "mesa_bwd_solve_kernel"):
        monkeypatch.setattr(triton_solve, name, LaunchSpy(getattr(triton_solve, name),
                                                           lambda kw: seen.append((kw["BK"], asked[-1]))))

    def run(K):
        gen = torch.Generator().manual_seed(1)
        q, k, v = (torch.nn.functional.normalize(torch.randn(1, 20, 1, K, generator=gen), dim=-1) for _ in range(3))
        g = -torch.rand(1, 20, 1, generator=gen)
        beta = torch.rand(1, 20, 1, generator=gen)
        lamb = torch.ones(1, K)
        leaves = [t.requires_grad_(True) for t in (q, k, v, g, beta, lamb)]
        mesa(*leaves, cg_steps=2, backend="triton")[0].sum().backward()

    for K, expected in ((16, 4), (64, 4), (100, 8), (128, 8)):
        seen.clear()
        run(K)
        assert seen == [(max(16, 1 << (K - 1).bit_length()), expected)] * 2, (K, seen)
    seen.clear()
    with launch.launch_settings(mesa={"fwd_solve": {"narrow_num_warps": 2}, "bwd_solve": {"narrow_max_K": 32}}):
        run(64)
    assert seen == [(64, 2), (64, 8)]
    with pytest.raises(ValueError, match="narrow_num_warps"):
        launch.SolveLaunch(narrow_num_warps=3)


def test_mesa_backward_solve_takes_narrow_rows_at_small_head_dims(monkeypatch):
    """MesaNet's adjoint CG runs narrow_rows (64) rows a program where the K-block is at most
    narrow_max_K (64) wide and rows (32) above it; the forward solve takes its 64 rows at
    every head dim; narrow_rows 0 leaves rows everywhere, and a row count that is no power of
    two from 16 to 256 (narrow_rows: or 0) is an error naming the setting."""
    from kernels import mesa
    from kernels.mesa import triton_solve

    seen = []
    for name in ("mesa_fwd_solve_kernel", "mesa_bwd_solve_kernel"):
        monkeypatch.setattr(triton_solve, name, LaunchSpy(getattr(triton_solve, name),
                                                           lambda kw, name=name: seen.append((name[5:8], kw["BK"], kw["BR"]))))

    def run(K):
        gen = torch.Generator().manual_seed(2)
        q, k, v = (torch.nn.functional.normalize(torch.randn(1, 20, 1, K, generator=gen), dim=-1) for _ in range(3))
        g = -torch.rand(1, 20, 1, generator=gen)
        beta = torch.rand(1, 20, 1, generator=gen)
        leaves = [t.requires_grad_(True) for t in (q, k, v, g, beta, torch.ones(1, K))]
        mesa(*leaves, cg_steps=2, backend="triton")[0].sum().backward()

    for K, bwd_rows in ((16, 64), (64, 64), (100, 32)):
        seen.clear()
        run(K)
        BK = max(16, 1 << (K - 1).bit_length())
        assert seen == [("fwd", BK, 64), ("bwd", BK, bwd_rows)], (K, seen)
    seen.clear()
    with launch.launch_settings(mesa={"bwd_solve": {"narrow_rows": 0}}):
        run(64)
    assert seen == [("fwd", 64, 64), ("bwd", 64, 32)]
    for bad in ({"rows": 48}, {"rows": 8}, {"narrow_rows": 24}):
        with pytest.raises(ValueError, match=f"SolveLaunch.{next(iter(bad))} must be one of"):
            launch.SolveLaunch(**bad)


def test_mesa_gradients_take_their_key_column_block(monkeypatch):
    """MesaNet's gradient kernel forms dk over GradsLaunch.BC key columns, capped at the whole
    K-block (K = 40: a 64 block, 32 columns by default, 16 or the whole block when asked); a
    BC that is not a tile width is refused."""
    from kernels import mesa
    from kernels.mesa import triton_grads

    seen = []
    monkeypatch.setattr(triton_grads, "mesa_bwd_grads_kernel",
                        LaunchSpy(triton_grads.mesa_bwd_grads_kernel, lambda kw: seen.append((kw["BK"], kw["BC"]))))
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.nn.functional.normalize(torch.randn(1, 20, 1, 40, generator=gen), dim=-1) for _ in range(3))
    leaves = [t.requires_grad_(True) for t in (q, k, v, -torch.rand(1, 20, 1, generator=gen),
                                               torch.rand(1, 20, 1, generator=gen), torch.ones(1, 40))]
    for changes, expected in (({}, (64, 32)), ({"grads": {"BC": 16}}, (64, 16)), ({"grads": {"BC": 256}}, (64, 64))):
        seen.clear()
        with launch.launch_settings(mesa=changes):
            mesa(*leaves, cg_steps=2, backend="triton")[0].sum().backward()
        assert seen == [expected], (changes, seen)
    with pytest.raises(ValueError, match="BC"):
        launch.GradsLaunch(BC=48)


@pytest.mark.parametrize("K, expected", [(128, 32), (64, 64)])
def test_the_no_gradient_fused_pass_caps_its_state_block(monkeypatch, K, expected):
    """The no-gradient fused state pass holds at most infer_fused.max_state (4,096) state
    entries: V-blocks of 32 at K = 128 and of 64 at K = 64 (on the CPU nothing narrows them
    further); bad caps are refused."""
    from kernels.gated_delta_rule import triton_fwd

    seen = []
    monkeypatch.setattr(triton_fwd, "state_fwd_kernel",
                        LaunchSpy(triton_fwd.state_fwd_kernel, lambda kw: seen.append((kw["BV"], kw["FUSE_OUTPUT"]))))
    q, k, v, g, beta = (t.detach() for t in _gdn_inputs(T=20, H=1, K=K, V=128))
    with torch.no_grad(), launch.launch_settings(gated_delta_rule={"infer_fused": {"min_heads": 1}}):
        gated_delta_rule(q, k, v, g, beta, backend="triton")
    assert seen == [(expected, True)]
    for bad in (100, 3000):
        with pytest.raises(ValueError, match="max_state"):
            launch.FusedStateLaunch(max_state=bad)


def test_the_no_gradient_fused_pass_goes_deeper_where_programs_are_few(monkeypatch):
    """The no-gradient fused state pass takes few_program_stages (3) where its programs fill at
    most few_program_waves (2) waves of the GPU's multiprocessors and num_stages (2) elsewhere,
    within the wide-row caps of stages_for; off the GPU, and for the training pass (off), the
    plain num_stages. The launch reads the device's multiprocessors (faked here: 132, an H100)."""
    from kernels.common.triton import utils
    from kernels.gated_delta_rule import triton_fwd

    cfg = launch.settings("gated_delta_rule").infer_fused
    assert (cfg.num_stages, cfg.few_program_stages, cfg.few_program_waves) == (2, 3, 2)
    assert [cfg.stages_at(128, 2, programs, 132) for programs in (1, 128, 264, 265, 2048)] == [3, 3, 3, 2, 2]
    assert cfg.stages_at(128, 2, 4, None) == 2
    assert cfg.stages_at(256, 2, 4, 132) == 2 and cfg.stages_at(128, 4, 4, 132) == 2 and cfg.stages_at(256, 4, 4, 132) == 1
    assert launch.settings("gated_delta_rule").fused_fwd.stages_at(128, 2, 4, 132) == 2
    with pytest.raises(ValueError, match="few_program"):
        launch.FusedStateLaunch(few_program_stages=-1)
    # the delta rules' backward state pass: three stages within one wave of programs only
    for op in ("delta_rule", "gated_delta_rule"):
        bwd = launch.settings(op).state_bwd
        assert [bwd.stages_at(128, 2, programs, 132) for programs in (128, 132, 133, 512)] == [3, 3, 2, 2]
    with pytest.raises(ValueError, match="few_program"):
        launch.StateBwdLaunch(few_program_waves=0)

    seen = []
    monkeypatch.setattr(triton_fwd, "state_fwd_kernel",
                        LaunchSpy(triton_fwd.state_fwd_kernel, lambda kw: seen.append(kw["num_stages"])))
    q, k, v, g, beta = (t.detach() for t in _gdn_inputs(T=20, H=1, K=32, V=32))
    for sms, expected in ((None, 2), (132, 3)):
        monkeypatch.setattr(utils, "multiprocessors", lambda device, sms=sms: sms)
        seen.clear()
        with torch.no_grad(), launch.launch_settings(gated_delta_rule={"infer_fused": {"min_heads": 1}}):
            gated_delta_rule(q, k, v, g, beta, backend="triton")
        assert seen == [expected], (sms, seen)


def test_state_passes_take_fewer_stages_for_wide_rows():
    """The state passes drop to one pipeline stage where a row of their K-block is 1 KB or more
    (fp32 at K = 256: two stages overflow a Hopper SM's shared memory), to at most two from
    512 B on, else keep num_stages (3 for the forward pass, 2 for the backward)."""
    cfg = launch.settings("gated_delta_rule")
    for pass_, stages in ((cfg.state_fwd, 3), (cfg.state_bwd, 2)):
        assert pass_.num_stages == stages
        assert pass_.stages_for(256, 4) == 1
        assert pass_.stages_for(256, 2) == 2 and pass_.stages_for(128, 4) == 2
        assert pass_.stages_for(128, 2) == stages and pass_.stages_for(64, 4) == stages


@pytest.mark.parametrize("precision, expected", [("highest", "ieee"), ("high", "tf32"), ("medium", "tf32")])
def test_fp32_dots_follow_torchs_matmul_precision(monkeypatch, precision, expected):
    """fp32 inputs launch the delta-rule and GLA kernels with true fp32 dots under torch's
    "highest" matmul precision and with TF32 under "high" / "medium" (as torch's fp32 matmuls);
    16-bit inputs always take their own dtype's products ("tf32", moot)."""
    from kernels.common.triton import utils
    from kernels.gated_delta_rule import triton_fwd
    from kernels.gated_linear_attention import triton_output

    seen = []
    for mod, name in ((triton_fwd, "output_fwd_kernel"), (triton_output, "chunk_fwd_output_kernel")):
        monkeypatch.setattr(mod, name, LaunchSpy(getattr(mod, name), lambda kw: seen.append(kw["PREC"])))
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision(precision)
        assert utils.dot_precision(torch.float32) == expected and utils.dot_precision(torch.bfloat16) == "tf32"
        q, k, v, g, beta = _gdn_inputs(T=40)
        gated_delta_rule(q, k, v, g, beta, backend="triton")
        gated_linear_attention(q, k, v, g, backend="triton")
    finally:
        torch.set_float32_matmul_precision(before)
    assert seen and set(seen) == {expected}, seen


def _every_kernel(op: str, **changes) -> dict:
    """launch_settings changes setting `changes` on every kernel launch object of `op`."""
    import dataclasses

    current = launch.settings(op)
    return {op: {f.name: dict(changes) for f in dataclasses.fields(current)
                 if isinstance(getattr(current, f.name), launch.KernelLaunch)}}


@pytest.mark.parametrize("precision, expected", [("highest", {"tf32x3"}), ("high", {"tf32", "tf32x3"})])
def test_fp32_dots_replace_the_true_fp32_dots(monkeypatch, precision, expected):
    """KernelLaunch.fp32_dots="tf32x3" takes the place of every "ieee" dot of the delta rule's
    kernels, forward and backward: all of them under "highest", the chunk inverse's alone under
    "high" (whose other fp32 dots are TF32). The interpreter computes the same either way, so
    the result matches the default's; its accuracy on a GPU is for tests/gpu."""
    from kernels.gated_delta_rule import triton_bwd, triton_bwd_grad, triton_fwd, triton_wy, triton_wy_bwd

    seen = []
    for mod in (triton_bwd, triton_bwd_grad, triton_fwd, triton_wy, triton_wy_bwd):
        for name in dir(mod):
            if name.endswith("_kernel") and hasattr(getattr(mod, name), "__getitem__"):  # a kernel[grid]
                monkeypatch.setattr(mod, name, LaunchSpy(getattr(mod, name), lambda kw: seen.extend(
                    kw[p] for p in ("PREC", "SOLVE_PREC") if p in kw)))
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision(precision)
        results = []
        for changes in ({}, _every_kernel("gated_delta_rule", fp32_dots="tf32x3")):
            seen.clear()
            q, k, v, g, beta = _gdn_inputs(T=70)
            with launch.launch_settings(**changes):
                o, _ = gated_delta_rule(q, k, v, g, beta, backend="triton")
            o.square().sum().backward()
            results.append((set(seen), [t.detach() for t in (o, q.grad, k.grad, v.grad, g.grad, beta.grad)]))
    finally:
        torch.set_float32_matmul_precision(before)
    (default_precs, default_out), (precs, out) = results
    assert "tf32x3" not in default_precs and precs == expected, (default_precs, precs)
    for a, b in zip(out, default_out):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_a_bad_fp32_dots_is_refused():
    with pytest.raises(ValueError, match=r"fp32_dots must be one of \['ieee', 'tf32x3'\], got 'tf32'"):
        with launch.launch_settings(gated_delta_rule={"dqkw": {"fp32_dots": "tf32"}}):
            pass


def test_fused_forward_stages_follow_the_key_width(monkeypatch):
    """FusedForwardLaunch.narrow_num_stages: the fused linear/GLA forward launches with it at
    head dims up to narrow_max_K and with num_stages above; 0 (the default) keeps num_stages;
    a negative value is refused, naming the field."""
    from kernels.gated_linear_attention import triton_fused_forward as fused

    seen = []
    monkeypatch.setattr(fused, "chunk_fwd_fused_kernel",
                        LaunchSpy(fused.chunk_fwd_fused_kernel, lambda kw: seen.append(kw["num_stages"])))
    every = {"enabled": True, "min_heads": 1, "num_stages": 2}
    for K, narrow, expected in ((16, 3, 3), (64, 3, 3), (65, 3, 2), (16, 0, 2)):
        q, k, v, g, _ = _gdn_inputs(T=40, K=K)
        with launch.launch_settings(gated_linear_attention={"fwd_fused_scalar": {**every, "narrow_num_stages": narrow}}):
            gated_linear_attention(q, k, v, g, backend="triton")
        assert seen[-1] == expected, (K, narrow, seen)
    with pytest.raises(ValueError, match="narrow_num_stages must be >= 0"):
        launch.FusedForwardLaunch(narrow_num_stages=-1)
