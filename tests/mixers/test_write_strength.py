"""beta from extreme logits stays inside the ops' (0, 1] (fp32 sigmoid underflows to 0)."""

import torch

from kernels import gated_delta_rule
from mixers.base import write_strength


def test_extreme_logits_stay_valid_for_the_op():
    logits = torch.tensor([[[-1e4, -100.0], [0.0, 1e4]]])  # [B=1, T=2, H=2]
    assert torch.sigmoid(logits).min() == 0  # the failure this guards against
    beta = write_strength(logits)
    assert beta.dtype == torch.float32 and (beta > 0).all() and (beta <= 1).all()
    assert beta[0, 1, 0] == 0.5 and beta[0, 1, 1] == 1.0
    q, k, v = (torch.randn(1, 2, 2, 8) for _ in range(3))
    g = torch.zeros(1, 2, 2)
    o, _ = gated_delta_rule(q, torch.nn.functional.normalize(k, dim=-1), v, g, beta, backend="torch")
    assert torch.isfinite(o).all()


def test_gradient_is_the_sigmoid_gradient_inside_the_range():
    logits = torch.tensor([-3.0, 0.0, 2.0], requires_grad=True)
    write_strength(logits).sum().backward()
    s = torch.sigmoid(logits.detach())
    torch.testing.assert_close(logits.grad, s * (1 - s))
