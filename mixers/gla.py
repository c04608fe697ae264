"""Gated linear attention: a data-dependent decay per key channel (GLA) or per head
(scalar gate, Mamba2/RetNet-style), from a low-rank projection of x."""

from __future__ import annotations

from typing import Literal

import torch.nn.functional as F
from pydantic import Field
from torch import nn

from kernels import gated_linear_attention, gated_linear_attention_step
from mixers.base import MixerConfig, gate_precision
from mixers.projected import ProjectedMixer
from mixers.registry import register_mixer


class GLAConfig(MixerConfig):
    gate: Literal["vector", "scalar"] = Field("vector", description="decay per key channel or per head")
    gate_rank: int = Field(16, ge=1, description="rank of the gate projection")
    gate_normalizer: float = Field(16.0, gt=0, description="g = logsigmoid(.) / gate_normalizer keeps decays near 1")


@register_mixer("gla")
class GatedLinearAttention(ProjectedMixer):
    Config = GLAConfig
    op_name = "gated_linear_attention"
    has_fused_step = True

    def __init__(self, d_model, config):
        super().__init__(d_model, config)
        width = self.num_heads * (self.head_dim if config.gate == "vector" else 1)
        self.gate_proj = nn.Sequential(
            nn.Linear(d_model, config.gate_rank, bias=False), nn.Linear(config.gate_rank, width, bias=True)
        )

    def gates(self, x):
        g = F.logsigmoid(gate_precision(self.gate_proj(x))) / self.config.gate_normalizer
        if self.config.gate == "vector":
            g = g.unflatten(-1, (self.num_heads, self.head_dim))
        return {"g": g}

    def run_op(self, q, k, v, gates, initial_state=None, output_final_state=False):
        return gated_linear_attention(
            q, k, v, gates["g"], initial_state=initial_state, output_final_state=output_final_state,
            backend=self.backend_used, chunk_size=self.config.chunk_size, check_values=self.value_checks_due(),
        )

    def step_op(self, q_t, k_t, v_t, gates_t, state):
        return gated_linear_attention_step(q_t, k_t, v_t, gates_t["g"], state, backend=self.step_backend())
