"""Linearized softmax attention as a Gated DeltaNet (seed 000, docs/design.md §7).

It has exactly the parameters of the softmax mixer (no gates to learn: the gates are
log(1 - 1/t)), so a trained softmax layer's state_dict loads into it unchanged. With
form="vala" the same weights run the first-order "vanilla" linearisation instead."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from kernels import linearized_softmax_gdn, linearized_softmax_gdn_step, vala_attention
from mixers.base import MixerConfig
from mixers.projected import ProjectedMixer
from mixers.registry import register_mixer


class LinGDNConfig(MixerConfig):
    form: Literal["gdn", "vala"] = Field("gdn", description="gdn: the delta-rule form; vala: first-order form")


@register_mixer("lin_gdn")
class LinearizedSoftmaxGDN(ProjectedMixer):
    Config = LinGDNConfig
    op_name = "linearized_softmax_gdn"
    output_gate = False

    def run_op(self, q, k, v, gates, initial_state=None, output_final_state=False):
        if self.config.form == "vala":
            if output_final_state or initial_state is not None:
                raise ValueError("lin_gdn with form='vala' has no decode state; use form='gdn' to decode")
            backend = "torch" if self.backend_used == "triton" else self.backend_used
            return vala_attention(q, k, v, backend=backend)
        return linearized_softmax_gdn(
            q, k, v, initial_state=initial_state, output_final_state=output_final_state,
            backend=self.backend_used, chunk_size=self.config.chunk_size,
        )

    def step_op(self, q_t, k_t, v_t, gates_t, state):
        if self.config.form == "vala":
            raise ValueError("lin_gdn with form='vala' has no decode state; use form='gdn' to decode")
        return linearized_softmax_gdn_step(q_t, k_t, v_t, state)

    def op_state_size(self, seq_len: int) -> int:
        # h [K, V], k_sum [K], v_sum [V] per head, and the token count.
        H, D, Dv = self.num_heads, self.head_dim, self.value_dim
        return H * (D * Dv + D + Dv) + 1
