"""Gated DeltaNet: the delta rule with a Mamba2-style data-dependent decay."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from pydantic import Field, field_validator
from torch import nn

from kernels import gated_delta_rule, gated_delta_rule_step
from mixers.base import MixerConfig, gate_precision, write_strength
from mixers.projected import ProjectedMixer
from mixers.registry import register_mixer


class DecayConfig(MixerConfig):
    """Options of a Mamba2-style decay g = -exp(A_log) softplus(W_a x + dt_bias) (gdn, mesa)."""

    decay_A_range: tuple[float, float] = Field(
        (1.0, 16.0), description="A = exp(A_log) starts uniform in this range (Mamba2's default)")
    decay_dt_range: tuple[float, float] = Field(
        (1e-3, 1e-1), description="softplus(dt_bias) starts log-uniform in this range; per-token decay ~ A * dt")

    @field_validator("decay_A_range", "decay_dt_range")
    @classmethod
    def _positive_range(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not 0 < v[0] <= v[1]:
            raise ValueError(f"must be (low, high) with 0 < low <= high, got {v}")
        return v


def decay_parameters(num_heads: int, config: DecayConfig) -> tuple[nn.Parameter, nn.Parameter]:
    """A_log and dt_bias: A uniform in config.decay_A_range, softplus(dt_bias) log-uniform in
    config.decay_dt_range (the defaults start exp(g) between about 0.2 and 0.999 per token)."""
    A_log = nn.Parameter(torch.log(torch.empty(num_heads).uniform_(*config.decay_A_range)))
    lo, hi = config.decay_dt_range
    dt = torch.exp(torch.empty(num_heads).uniform_(math.log(lo), math.log(hi)))
    dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
    return A_log, dt_bias


def decay_gate(a: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor) -> torch.Tensor:
    """g = -exp(A_log) * softplus(a + dt_bias) <= 0, in fp32 or wider. a: [B, T, H]."""
    return -gate_precision(A_log).exp() * F.softplus(gate_precision(a) + dt_bias)


@register_mixer("gdn")
class GatedDeltaNet(ProjectedMixer):
    """h_t = exp(g_t)(I - beta_t k_t k_t^T) h_{t-1} + beta_t k_t v_t^T."""

    Config = DecayConfig
    op_name = "gated_delta_rule"
    has_fused_step = True
    l2norm_qk = True

    def __init__(self, d_model, config):
        super().__init__(d_model, config)
        self.a_proj = nn.Linear(d_model, self.num_heads, bias=False)
        self.b_proj = nn.Linear(d_model, self.num_heads, bias=True)
        self.A_log, self.dt_bias = decay_parameters(self.num_heads, config)

    def gates(self, x):
        return {
            "g": decay_gate(self.a_proj(x), self.A_log, self.dt_bias),
            "beta": write_strength(self.b_proj(x)),
        }

    def run_op(self, q, k, v, gates, initial_state=None, output_final_state=False):
        return gated_delta_rule(
            q, k, v, gates["g"], gates["beta"], initial_state=initial_state,
            output_final_state=output_final_state, backend=self.backend_used, chunk_size=self.config.chunk_size,
            check_values=self.value_checks_due(),
        )

    def step_op(self, q_t, k_t, v_t, gates_t, state):
        return gated_delta_rule_step(q_t, k_t, v_t, gates_t["g"], gates_t["beta"], state,
                                     backend=self.step_backend())
