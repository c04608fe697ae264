"""Backend resolution and the shared argument checks."""

import pytest
import torch

from kernels.common.checks import check_beta, check_gate, check_qkv, default_scale
from kernels.common.dispatch import backend_status, resolve_backend


def test_auto_picks_torch_on_cpu_and_triton_on_cuda(monkeypatch):
    assert resolve_backend("gated_delta_rule", "auto", "cpu") == "torch"
    assert resolve_backend("softmax_attention", "auto", "cpu") == "torch"
    if torch.cuda.is_available():
        assert resolve_backend("gated_delta_rule", "auto", "cuda") == "triton"


def test_unknown_backend_names_valid_ones():
    with pytest.raises(ValueError, match=r"backend='cuda'.*'reference', 'torch', 'triton'"):
        resolve_backend("delta_rule", "cuda", "cpu")
    with pytest.raises(ValueError, match="flash_attn"):
        resolve_backend("softmax_attention", "triton", "cpu")


def test_triton_on_cpu_needs_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    status = backend_status("triton", "cpu")
    assert not status.usable and "TRITON_INTERPRET" in status.reason
    with pytest.raises(ValueError, match="cannot run on cpu"):
        resolve_backend("linear_attention", "triton", "cpu")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert resolve_backend("linear_attention", "triton", "cpu") == "triton"


@pytest.mark.parametrize("op", ["linear_attention", "gated_linear_attention", "delta_rule", "gated_delta_rule",
                                "linearized_softmax_gdn", "mesa"])
def test_interpreted_triton_refuses_bf16_before_computing(monkeypatch, op):
    """The interpreter's bf16 tiles multiply wrongly (rel err ~1e9 against the reference)."""
    import kernels

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(ValueError, match="cannot take bfloat16"):
        resolve_backend(op, "triton", "cpu", torch.bfloat16)
    assert resolve_backend(op, "triton", "cpu", torch.float16) == "triton"
    q = k = v = torch.randn(1, 16, 1, 16).bfloat16()
    if op == "linear_attention":
        with pytest.raises(ValueError, match="cannot take bfloat16"):
            kernels.linear_attention(q, k, v, backend="triton")


def test_checks_name_the_argument():
    q = torch.randn(1, 5, 2, 4)
    with pytest.raises(ValueError, match=r"q must have 4 dimensions.*\[1, 5, 8\]"):
        check_qkv("op", q.flatten(-2), q, q)
    with pytest.raises(ValueError, match="v must be"):
        check_qkv("op", q, q, torch.randn(1, 6, 2, 4))
    with pytest.raises(ValueError, match=r"g must have shape \[1, 5, 2\]"):
        check_gate("op", torch.zeros(1, 5, 3), 1, 5, 2, 4, allow_vector=False)
    with pytest.raises(ValueError, match=r"g is a log-space decay.*max\(g\) = 0.5"):
        check_gate("op", torch.full((1, 5, 2), 0.5), 1, 5, 2, 4, allow_vector=False)
    with pytest.raises(ValueError, match="must be <= 0"):
        check_gate("op", torch.full((1, 5, 2), float("nan")), 1, 5, 2, 4, allow_vector=False)
    assert check_gate("op", torch.zeros(1, 5, 2, 4), 1, 5, 2, 4, allow_vector=True)
    with pytest.raises(ValueError, match=r"beta must lie in \(0, 1\]"):
        check_beta("op", torch.zeros(1, 5, 2), 1, 5, 2)
    with pytest.raises(ValueError, match="scale"):
        default_scale("op", -1.0, 4)
    assert default_scale("op", None, 16) == 0.25
