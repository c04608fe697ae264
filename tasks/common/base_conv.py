"""BaseConv: the gated short convolution that Zoology's MQAR models put in front of the
mixer under test (its `Hybrid` of [BaseConv, mixer] layers, Arora et al. 2023).

    y = conv(u) * W u + u,   conv: depthwise causal, width `kernel_size`, with bias;

no activation. It presents the mixer interface the model and the decoder use (forward,
prefill, step, state_size, backend_used), so a block holds it in place of a mixer."""

from __future__ import annotations

import torch
from torch import nn

from mixers.base import causal_depthwise_conv, conv_tail


class BaseConv(nn.Module):
    """x [B, T, d_model] -> [B, T, d_model]; decodes with a cache of the last kernel_size-1 inputs."""

    backend_used = "torch"

    def __init__(self, d_model: int, kernel_size: int = 3):
        super().__init__()
        self.kernel_size = kernel_size
        self.projection = nn.Linear(d_model, d_model)
        # The nn.Conv1d holds the weight and bias; the forward is causal_depthwise_conv.
        self.conv = nn.Conv1d(d_model, d_model, kernel_size, groups=d_model, padding=kernel_size - 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mixed = causal_depthwise_conv(x, self.conv.weight, self.conv.bias)
        return mixed * self.projection(x) + x

    def prefill(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole prompt x [B, T, d_model] and the decode cache [B, d_model, kernel_size-1]."""
        return self(x), conv_tail(x, self.kernel_size - 1)

    def step(self, x_t: torch.Tensor, cache: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """One token x_t [B, d_model] -> ([B, d_model], cache)."""
        B, D = x_t.shape
        if cache is None:
            cache = x_t.new_zeros(B, D, self.kernel_size - 1)
        window = torch.cat([cache, x_t.unsqueeze(-1)], dim=-1)  # [B, D, kernel_size]
        mixed = (window * self.conv.weight.squeeze(1)).sum(-1) + self.conv.bias
        return mixed * self.projection(x_t) + x_t, window[..., 1:]

    def state_size(self, seq_len: int) -> int:
        """Floats kept per sequence to decode: the convolution window."""
        return self.projection.in_features * (self.kernel_size - 1)
