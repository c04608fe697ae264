"""Bad inputs to the public ops: each is a ValueError naming the argument and what is valid,
raised before any computation (empty dimensions, mixed dtypes, integer gates or states, a
gate on another device)."""

from __future__ import annotations

import pytest
import torch

import kernels

B, T, H, K, V = 2, 8, 2, 4, 4


def _args(op: str, **over):
    g = torch.Generator().manual_seed(0)
    args = {"q": torch.randn(B, T, H, K, generator=g), "k": torch.randn(B, T, H, K, generator=g),
            "v": torch.randn(B, T, H, V, generator=g)}
    if op in ("gated_linear_attention", "gated_delta_rule", "mesa"):
        args["g"] = -torch.rand(B, T, H, generator=g)
    if op in ("delta_rule", "gated_delta_rule", "mesa"):
        args["beta"] = torch.rand(B, T, H, generator=g) * 0.5 + 0.25
    if op == "mesa":
        args["lamb"] = torch.ones(H, K)
    args.update(over)
    return args


OPS = ["linear_attention", "gated_linear_attention", "delta_rule", "gated_delta_rule", "mesa"]
GATED = ["gated_linear_attention", "gated_delta_rule", "mesa"]


@pytest.mark.parametrize("op", OPS)
def test_an_empty_batch_is_named(op):
    args = _args(op)
    args = {k: (t[:0] if k in ("q", "k", "v", "g", "beta") else t) for k, t in args.items()}
    with pytest.raises(ValueError, match=r"every dimension must be at least 1 \(B, T, H, K, V\)"):
        getattr(kernels, op)(**args, backend="torch")


@pytest.mark.parametrize("op", OPS)
def test_mixed_input_dtypes_are_named(op):
    args = _args(op)
    args["v"] = args["v"].double()
    with pytest.raises(ValueError, match="q, k, v must share one dtype"):
        getattr(kernels, op)(**args, backend="torch")


@pytest.mark.parametrize("op", GATED)
def test_an_integer_gate_is_refused(op):
    args = _args(op, g=torch.zeros(B, T, H, dtype=torch.int64))
    with pytest.raises(ValueError, match="g has dtype torch.int64; valid: float16"):
        getattr(kernels, op)(**args, backend="torch")


@pytest.mark.parametrize("op", ["delta_rule", "gated_delta_rule", "mesa"])
def test_an_integer_beta_is_refused(op):
    args = _args(op, beta=torch.ones(B, T, H, dtype=torch.int64))
    with pytest.raises(ValueError, match="beta has dtype torch.int64"):
        getattr(kernels, op)(**args, backend="torch")


@pytest.mark.parametrize("op", ["linear_attention", "gated_linear_attention", "delta_rule", "gated_delta_rule"])
def test_an_integer_state_is_refused(op):
    args = _args(op, initial_state=torch.zeros(B, H, K, V, dtype=torch.int64))
    with pytest.raises(ValueError, match="initial_state has dtype torch.int64"):
        getattr(kernels, op)(**args, backend="torch")


@pytest.mark.parametrize("op", GATED)
def test_a_gate_on_another_device_is_named(op):
    args = _args(op, g=-torch.rand(B, T, H, device="meta"))
    with pytest.raises(ValueError, match="g is on meta but q, k, v are on cpu"):
        getattr(kernels, op)(**args, backend="torch")
