"""DeltaNet: the delta rule with a learned per-token writing strength beta."""

from __future__ import annotations

from torch import nn

from kernels import delta_rule, delta_rule_step
from mixers.base import write_strength
from mixers.projected import ProjectedMixer
from mixers.registry import register_mixer


@register_mixer("deltanet")
class DeltaNet(ProjectedMixer):
    """h_t = (I - beta_t k_t k_t^T) h_{t-1} + beta_t k_t v_t^T with l2-normalised q, k."""

    op_name = "delta_rule"
    has_fused_step = True
    l2norm_qk = True

    def __init__(self, d_model, config):
        super().__init__(d_model, config)
        self.b_proj = nn.Linear(d_model, self.num_heads, bias=True)

    def gates(self, x):
        return {"beta": write_strength(self.b_proj(x))}

    def run_op(self, q, k, v, gates, initial_state=None, output_final_state=False):
        return delta_rule(
            q, k, v, gates["beta"], initial_state=initial_state, output_final_state=output_final_state,
            backend=self.backend_used, chunk_size=self.config.chunk_size, check_values=self.value_checks_due(),
        )

    def step_op(self, q_t, k_t, v_t, gates_t, state):
        return delta_rule_step(q_t, k_t, v_t, gates_t["beta"], state, backend=self.step_backend())
