"""Linear attention (Katharopoulos et al.): a positive feature map and, by default, the
normalising denominator q . sum(k), computed by the same op with a ones column appended to v."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field

from kernels import linear_attention, linear_attention_step
from mixers.base import MixerConfig
from mixers.projected import ProjectedMixer
from mixers.registry import register_mixer


class LinearConfig(MixerConfig):
    feature_map: Literal["elu1", "identity"] = Field("elu1", description="phi(x) applied to q and k")
    normalize: bool = Field(True, description="divide by q . sum(k) (needs a positive feature map)")


@register_mixer("linear")
class LinearAttention(ProjectedMixer):
    """o_t = phi(q_t)^T h_t / (phi(q_t) . z_t), h_t = h_{t-1} + phi(k_t) v_t^T, z_t = z_{t-1} + phi(k_t)."""

    Config = LinearConfig
    op_name = "linear_attention"
    has_fused_step = True
    output_gate = False

    def feature_map(self, q, k):
        if self.config.feature_map == "elu1":
            return F.elu(q) + 1.0, F.elu(k) + 1.0
        return q, k

    def _with_ones(self, v: torch.Tensor) -> torch.Tensor:
        return torch.cat([v, torch.ones_like(v[..., :1])], dim=-1) if self.config.normalize else v

    def _normalise(self, o: torch.Tensor) -> torch.Tensor:
        if not self.config.normalize:
            return o
        return o[..., :-1] / (o[..., -1:].float() + 1e-6).to(o.dtype)

    def run_op(self, q, k, v, gates, initial_state=None, output_final_state=False):
        o, state = linear_attention(
            q, k, self._with_ones(v), initial_state=initial_state, output_final_state=output_final_state,
            backend=self.backend_used, chunk_size=self.config.chunk_size,
        )
        return self._normalise(o), state

    def step_op(self, q_t, k_t, v_t, gates_t, state):
        o_t, state = linear_attention_step(q_t, k_t, self._with_ones(v_t), state, backend=self.step_backend())
        return self._normalise(o_t), state

    def op_state_size(self, seq_len: int) -> int:
        return self.num_heads * self.head_dim * (self.value_dim + int(self.config.normalize))
