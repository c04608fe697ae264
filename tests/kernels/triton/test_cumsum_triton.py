"""The chunk-local cumulative log2-gates the GLA and gated-delta-rule kernels form decays from
(kernels/common/triton/cumsum.py, and gamma of the delta rules' wy_fwd): each value within
one fp32 ulp of the exact chunk sum, on strong gates (sums in the hundreds), partial last
chunks and -inf gates (raised to the floor). An fp32 scan adds the rounding of its partial
sums on top, which decays between near tokens inherit."""

from __future__ import annotations

import pytest
import torch

from kernels.common.triton.gates import GATE_FLOOR_LOG2, LOG2E

CHUNK = 64


def exact_chunk_sums(g: torch.Tensor, reverse: bool = False) -> torch.Tensor:
    """fp64 chunk-local cumulative sums of LOG2E * g along dim 1 ([B, T, H] or [B, T, H, D]),
    per-token log2-gates raised to the floor first."""
    r = torch.clamp(g.double() * LOG2E, min=GATE_FLOOR_LOG2)
    out = torch.empty_like(r)
    for t0 in range(0, g.shape[1], CHUNK):
        part = r[:, t0:t0 + CHUNK]
        out[:, t0:t0 + CHUNK] = part.flip(1).cumsum(1).flip(1) if reverse else part.cumsum(1)
    return out


def assert_within_an_ulp(ours: torch.Tensor, exact: torch.Tensor) -> None:
    assert ours.dtype == torch.float32 and torch.isfinite(ours).all()
    ulp = torch.finfo(torch.float32).eps * exact.abs().clamp(min=1.0)  # ulp of |x| >= 1, at most
    worst = ((ours.double() - exact).abs() / ulp).max().item()
    assert worst <= 1.0, f"{worst:.2f} ulps from the exact chunk sum"


def strong_gates(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Gates of -2 to -9 nats a token (a chunk sums to ~500 nats), some -inf."""
    gen = torch.Generator().manual_seed(seed)
    g = -2.0 - 7.0 * torch.rand(shape, generator=gen)
    g[:, 5] = float("-inf")
    return g


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("vector", [False, True], ids=["scalar", "vector"])
@pytest.mark.parametrize("T", [100, 192])
def test_chunk_local_cumsum_rounds_once(T, vector, reverse):
    from kernels.common.triton.cumsum import chunk_local_cumsum

    g = strong_gates((2, T, 3, 20) if vector else (2, T, 3), seed=T)
    ours = chunk_local_cumsum(g, CHUNK, LOG2E, reverse=reverse)
    assert_within_an_ulp(ours, exact_chunk_sums(g, reverse))


@pytest.mark.parametrize("shape", [(3, 100, 70), (2, 130, 5, 40)], ids=["scalar_70_heads", "vector_5x40"])
def test_chunk_local_cumsum_over_several_column_blocks(shape):
    """More heads (or heads x key columns) than one program scans: the column blocks, the last
    one partial, each restart at every chunk and leave the others' sums alone."""
    from kernels.common.triton.cumsum import MAX_COLUMNS, chunk_local_cumsum

    assert shape[2] * (shape[3] if len(shape) == 4 else 1) > MAX_COLUMNS
    g = strong_gates(shape, seed=sum(shape))
    assert_within_an_ulp(chunk_local_cumsum(g, CHUNK, LOG2E), exact_chunk_sums(g))


@pytest.mark.parametrize("T", [100, 192])
def test_gated_delta_rule_gamma_rounds_once(T):
    from kernels.gated_delta_rule.triton_wy import wy_fwd

    gen = torch.Generator().manual_seed(T)
    k = torch.nn.functional.normalize(torch.randn(1, T, 2, 32, generator=gen), dim=-1)
    v = torch.randn(1, T, 2, 32, generator=gen)
    beta = torch.rand(1, T, 2, generator=gen)
    g = strong_gates((1, T, 2), seed=T)
    gamma = wy_fwd(k, v, beta, g)[0]
    assert_within_an_ulp(gamma, exact_chunk_sums(g))
