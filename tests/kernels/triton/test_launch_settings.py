"""Launch settings reach the kernels: a forward runs under the settings in effect, its
backward under the same ones wherever it runs, and a recording notes them."""

from __future__ import annotations

import torch

from kernels import gated_delta_rule, gated_linear_attention
from kernels.common import launch


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
