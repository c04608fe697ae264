"""Softmax attention: the quadratic baseline every linear mixer is measured against."""

from __future__ import annotations

from kernels import softmax_attention, softmax_attention_step
from mixers.projected import ProjectedMixer
from mixers.registry import register_mixer


@register_mixer("softmax")
class SoftmaxAttention(ProjectedMixer):
    """Causal multi-head softmax attention; decoding keeps a KV cache that grows with T."""

    op_name = "softmax_attention"
    output_gate = False

    def run_op(self, q, k, v, gates, initial_state=None, output_final_state=False):
        return softmax_attention(
            q, k, v, initial_state=initial_state, output_final_state=output_final_state, backend=self.backend_used
        )

    def step_op(self, q_t, k_t, v_t, gates_t, state):
        return softmax_attention_step(q_t, k_t, v_t, state)

    def op_state_size(self, seq_len: int) -> int:
        return self.num_heads * (self.head_dim + self.value_dim) * seq_len
