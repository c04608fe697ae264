"""MesaNet: the output is H_kv^T (H_kk + diag(lamb))^{-1} q, an online least-squares fit
of values from keys solved afresh for every query (docs/design.md §8)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from kernels import mesa, mesa_step
from mixers.base import gate_precision, write_strength
from mixers.gdn import DecayConfig, decay_gate, decay_parameters
from mixers.projected import ProjectedMixer
from mixers.registry import register_mixer


class MesaConfig(DecayConfig):
    cg_steps: int = Field(15, ge=1, description="conjugate-gradient iterations per chunk")
    cg_tol: float | None = Field(None, gt=0, description="stop CG early below this relative residual")
    lamb_min: float = Field(0.25, gt=0, description="lower bound of the learned ridge lamb")


@register_mixer("mesa")
class MesaNet(ProjectedMixer):
    Config = MesaConfig
    op_name = "mesa"
    l2norm_qk = True

    def __init__(self, d_model, config):
        super().__init__(d_model, config)
        self.a_proj = nn.Linear(d_model, self.num_heads, bias=False)
        self.b_proj = nn.Linear(d_model, self.num_heads, bias=True)
        self.A_log, self.dt_bias = decay_parameters(self.num_heads, config)
        self.lamb_raw = nn.Parameter(torch.zeros(self.num_heads, self.head_dim))

    def lamb(self) -> torch.Tensor:
        """The ridge lamb: [H, K] > 0."""
        return F.softplus(gate_precision(self.lamb_raw)) + self.config.lamb_min

    def gates(self, x):
        return {
            "g": decay_gate(self.a_proj(x), self.A_log, self.dt_bias),
            "beta": write_strength(self.b_proj(x)),
        }

    def run_op(self, q, k, v, gates, initial_state=None, output_final_state=False):
        return mesa(
            q, k, v, gates["g"], gates["beta"], self.lamb(), initial_state=initial_state,
            output_final_state=output_final_state, backend=self.backend_used,
            chunk_size=self.config.chunk_size, cg_steps=self.config.cg_steps, cg_tol=self.config.cg_tol,
            check_values=self.value_checks_due(),
        )

    def step_op(self, q_t, k_t, v_t, gates_t, state):
        return mesa_step(q_t, k_t, v_t, gates_t["g"], gates_t["beta"], self.lamb(), state)

    def op_state_size(self, seq_len: int) -> int:
        D = self.head_dim
        return self.num_heads * (D * D + D * self.value_dim)
