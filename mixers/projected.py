"""The shared layer shape of the registered mixers: project x to per-head q, k, v (with an
optional short convolution), compute the mixer's own gates, call one op, then the
optional output RMSNorm and SiLU gate and the output projection.

A mixer subclass sets a few class flags and implements `gates`, `run_op` and `step_op`.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from mixers.base import Mixer, MixerConfig, ShortConv, conv_tail


class DecodeCache(NamedTuple):
    """What a projected mixer keeps between decode steps: conv windows and the op state."""

    conv: tuple[torch.Tensor | None, ...] | None
    state: Any


class ProjectedMixer(Mixer):
    """q, k, v projections -> op -> (norm, gate) -> output projection."""

    # SiLU-gated, RMS-normalised output (GLA/GDN style) by default; off for softmax-shaped
    # mixers. MixerConfig.output_gate / output_norm override them per instance
    # (self.gated_output, self.normed_output); the norm follows the gate unless set.
    output_gate: ClassVar[bool] = True
    # l2-normalise q and k per head (the delta rules need ||k|| = 1 for stability).
    l2norm_qk: ClassVar[bool] = False

    def __init__(self, d_model: int, config: MixerConfig):
        super().__init__(d_model, config)
        H, D, Dv = self.num_heads, self.head_dim, self.value_dim
        self.q_proj = nn.Linear(d_model, H * D, bias=False)
        self.k_proj = nn.Linear(d_model, H * D, bias=False)
        self.v_proj = nn.Linear(d_model, H * Dv, bias=False)
        self.o_proj = nn.Linear(H * Dv, d_model, bias=False)
        if config.short_conv:
            self.q_conv = ShortConv(H * D, config.conv_size)
            self.k_conv = ShortConv(H * D, config.conv_size)
            self.v_conv = ShortConv(H * Dv, config.conv_size)
        self.gated_output = self.output_gate if config.output_gate is None else config.output_gate
        self.normed_output = self.gated_output if config.output_norm is None else config.output_norm
        if self.normed_output:
            self.o_norm = nn.RMSNorm(Dv, eps=1e-6)
        if self.gated_output:
            self.g_proj = nn.Linear(d_model, H * Dv, bias=False)

    # -- hooks for subclasses -------------------------------------------------------------
    def gates(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-token gates from x [B, T, d_model] (e.g. {"g": [B,T,H], "beta": [B,T,H]})."""
        return {}

    def run_op(self, q, k, v, gates: dict, initial_state=None, output_final_state=False):
        """Call the op on [B, T, H, D] tensors; return (o [B, T, H, D], state)."""
        raise NotImplementedError

    def step_op(self, q_t, k_t, v_t, gates_t: dict, state):
        """One decode step of the op on [B, H, D] tensors; return (o_t, state)."""
        raise NotImplementedError

    def feature_map(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Transform per-head q, k before the op (default: l2 norm when `l2norm_qk`)."""
        if self.l2norm_qk:
            q = F.normalize(q, dim=-1, eps=1e-6)
            k = F.normalize(k, dim=-1, eps=1e-6)
        return q, k

    # -- shared plumbing ------------------------------------------------------------------
    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        return t.unflatten(-1, (self.num_heads, self.head_dim))

    def _value_heads(self, t: torch.Tensor) -> torch.Tensor:
        return t.unflatten(-1, (self.num_heads, self.value_dim))

    def _project(self, x: torch.Tensor):
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if self.config.short_conv:
            q, k, v = self.q_conv(q), self.k_conv(k), self.v_conv(v)
        q, k = self.feature_map(self._heads(q), self._heads(k))
        return q, k, self._value_heads(v)

    def _output(self, o: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        if self.normed_output:
            o = self.o_norm(o)
        if self.gated_output:
            o = o * F.silu(self._value_heads(self.g_proj(x)))
        return self.o_proj(o.flatten(-2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, T, d_model] -> [B, T, d_model]."""
        self.resolve(x)
        q, k, v = self._project(x)
        o, _ = self.run_op(q, k, v, self.gates(x))
        return self._output(o.to(x.dtype), x)

    def prefill(self, x: torch.Tensor) -> tuple[torch.Tensor, DecodeCache]:
        """Run a whole prompt x: [B, T, d_model] and return the decode cache after it."""
        self.resolve(x)
        q, k, v = self._project(x)
        o, state = self.run_op(q, k, v, self.gates(x), output_final_state=True)
        conv = None
        if self.config.short_conv:
            w = self.config.conv_size - 1
            conv = tuple(conv_tail(p(x), w) for p in (self.q_proj, self.k_proj, self.v_proj))
        return self._output(o.to(x.dtype), x), DecodeCache(conv, state)

    def step(self, x_t: torch.Tensor, cache: DecodeCache | None) -> tuple[torch.Tensor, DecodeCache]:
        """Decode one token: x_t [B, d_model] -> ([B, d_model], cache)."""
        q, k, v = self.q_proj(x_t), self.k_proj(x_t), self.v_proj(x_t)
        conv = None
        if self.config.short_conv:
            old = cache.conv if cache is not None and cache.conv is not None else (None, None, None)
            (q, cq), (k, ck), (v, cv) = (
                conv_mod.step(t, c) for conv_mod, t, c in zip((self.q_conv, self.k_conv, self.v_conv), (q, k, v), old)
            )
            conv = (cq, ck, cv)
        q, k = self.feature_map(self._heads(q), self._heads(k))
        gates_t = {name: t[:, 0] for name, t in self.gates(x_t.unsqueeze(1)).items()}
        o_t, state = self.step_op(q, k, self._value_heads(v), gates_t, cache.state if cache is not None else None)
        out = self._output(o_t.to(x_t.dtype).unsqueeze(1), x_t.unsqueeze(1))[:, 0]
        return out, DecodeCache(conv, state)

    def state_size(self, seq_len: int) -> int:
        width = self.num_heads * (2 * self.head_dim + self.value_dim)
        conv = width * (self.config.conv_size - 1) if self.config.short_conv else 0
        return conv + self.op_state_size(seq_len)

    def op_state_size(self, seq_len: int) -> int:
        """Floats of the op's own decode state per sequence (default: one K x V matrix per head)."""
        return self.num_heads * self.head_dim * self.value_dim
