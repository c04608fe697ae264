"""The mixer contract (docs/design.md §4) and the pieces every mixer shares.

A mixer maps x: [B, T, d_model] -> [B, T, d_model]. It owns its projections and gates,
calls one op from `kernels`, reports `state_size()` (floats kept per sequence for
decoding) and decodes one token at a time through `step`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, field_validator
from torch import nn

from kernels import resolve_backend


def gate_precision(t: torch.Tensor) -> torch.Tensor:
    """Gates are computed in fp32 at least (bf16 decays lose the digits near 1), fp64 for fp64 models."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def write_strength(logits: torch.Tensor) -> torch.Tensor:
    """beta = sigmoid(logits) in fp32 or wider, kept inside the ops' (0, 1]: a logit below
    about -88 underflows to exactly 0 in fp32 (seen in diverging runs), which the ops refuse."""
    beta = torch.sigmoid(gate_precision(logits))
    return beta.clamp_min(torch.finfo(beta.dtype).tiny)


class MixerConfig(BaseModel):
    """Options every mixer takes; a mixer subclasses this to add its own."""

    model_config = ConfigDict(extra="forbid")

    num_heads: int = Field(2, ge=1, description="number of heads")
    head_dim: int | None = Field(None, ge=1, description="per-head key width; default expand_k * d_model // num_heads")
    expand_k: float = Field(1.0, gt=0, description="key width over all heads / d_model when head_dim is unset (GLA: 0.5)")
    expand_v: float = Field(1.0, gt=0, description="value width per head / head_dim (Gated DeltaNet's expand_v)")
    short_conv: bool = Field(True, description="causal depthwise convolution on q, k, v")
    conv_size: int = Field(4, ge=1, le=16, description="short convolution width")
    backend: str = Field("auto", description="op backend: auto, reference, torch, triton (softmax: torch, fa4, fa3, flash_attn)")
    chunk_size: int = Field(64, ge=16, description="chunk length of the chunkwise forms")
    output_gate: bool | None = Field(
        None, description="SiLU gate (from x) on the op's output; null: the mixer's own default")
    output_norm: bool | None = Field(
        None, description="per-head RMSNorm on the op's output; null: the mixer's own default")

    @field_validator("chunk_size")
    @classmethod
    def _power_of_two(cls, v: int) -> int:
        if v & (v - 1):
            raise ValueError(f"chunk_size must be a power of two, got {v}")
        return v


def causal_depthwise_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Causal depthwise convolution over time, in the channels-last layout of the layers.

    x: [B, T, D]; weight: [D, 1, W] (an nn.Conv1d(D, D, W, groups=D) weight); bias: [D] or
    None -> [B, T, D], y_t = sum_j weight[:, 0, j] * x_{t - W + 1 + j} (+ bias), with x_s = 0
    for s < 0: what nn.Conv1d with padding W - 1 gives on its first T outputs.

    A sum of W shifted, scaled copies of x rather than a convolution kernel: for the short
    widths of these layers it needs no transpose to [B, D, T] and back, and under
    torch.compile it fuses with the ops around it, where a depthwise convolution kernel (and
    its two backward kernels) stays a separate launch that reads the whole input again."""
    T, W = x.shape[1], weight.shape[-1]
    padded = F.pad(x, (0, 0, W - 1, 0))
    taps = weight.squeeze(1).t()  # [W, D]
    y = padded[:, :T] * taps[0]
    for j in range(1, W):
        y = y + padded[:, j:j + T] * taps[j]
    return y if bias is None else y + bias


class ShortConv(nn.Module):
    """Causal depthwise 1-D convolution over time with SiLU, as in recent linear-attention layers.

    x: [B, T, D] -> [B, T, D]; `step` takes x_t: [B, D] and a cache [B, D, width-1]."""

    def __init__(self, dim: int, width: int):
        super().__init__()
        self.width = width
        # An nn.Conv1d holds the weight (its init and its state-dict name); the forward is
        # causal_depthwise_conv.
        self.conv = nn.Conv1d(dim, dim, width, groups=dim, padding=width - 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(causal_depthwise_conv(x, self.conv.weight))

    def step(self, x_t: torch.Tensor, cache: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        B, D = x_t.shape
        if cache is None:
            cache = x_t.new_zeros(B, D, self.width - 1)
        window = torch.cat([cache, x_t.unsqueeze(-1)], dim=-1)  # [B, D, width]
        y = (window * self.conv.weight.squeeze(1)).sum(-1)
        return F.silu(y), window[..., 1:]


def conv_tail(pre: torch.Tensor, width: int) -> torch.Tensor:
    """The last `width` convolution inputs of pre [B, T, D] as a decode cache [B, D, width]
    (zero-padded for prompts shorter than width; empty for width 0)."""
    tail = pre[:, pre.shape[1] - min(width, pre.shape[1]):].transpose(1, 2)
    if tail.shape[-1] < width:
        tail = F.pad(tail, (width - tail.shape[-1], 0))
    return tail


def layer_widths(d_model: int, config: MixerConfig) -> tuple[int, int]:
    """(head_dim, value_dim) of a layer of width d_model; ValueError naming the options when the
    heads do not split the key width evenly or a width is not a whole number >= 1."""
    if config.head_dim is None:
        key_width = d_model * config.expand_k
        if key_width != int(key_width) or int(key_width) % config.num_heads:
            whole = key_width == int(key_width)
            valid = [h for h in range(1, int(key_width) + 1) if int(key_width) % h == 0] if whole else []
            raise ValueError(
                f"num_heads={config.num_heads} does not split the key width expand_k * d_model = {key_width:g} "
                f"(d_model={d_model}, expand_k={config.expand_k:g}) evenly; valid num_heads: "
                f"{', '.join(map(str, valid)) or 'none'}, or set head_dim")
        head_dim = int(key_width) // config.num_heads
    else:
        head_dim = config.head_dim
    value_dim = round(head_dim * config.expand_v)
    if value_dim < 1 or value_dim != head_dim * config.expand_v:
        raise ValueError(
            f"expand_v={config.expand_v} with head_dim={head_dim} gives a value width of "
            f"{head_dim * config.expand_v}; it must be a whole number >= 1")
    return head_dim, value_dim


class Mixer(nn.Module):
    """Base class of every registered mixer.

    Subclasses set `Config`, build their parameters in `__init__(d_model, config)`, and
    implement `forward(x)`, `step(x_t, cache)` and `state_size(seq_len)`."""

    Config: ClassVar[type[MixerConfig]] = MixerConfig
    registry_name: ClassVar[str] = ""
    op_name: ClassVar[str] = ""
    # True where the op's one-token *_step takes backend= (a fused Triton step exists)
    has_fused_step: ClassVar[bool] = False

    def __init__(self, d_model: int, config: MixerConfig):
        super().__init__()
        self.d_model = d_model
        self.config = config
        self.num_heads = config.num_heads
        self.head_dim, self.value_dim = layer_widths(d_model, config)
        self.backend_used: str | None = None
        self.values_checked = False  # see value_checks_due

    @classmethod
    def from_options(cls, d_model: int, options: dict[str, Any] | None = None) -> "Mixer":
        """Build from a plain dict of options, validated against `cls.Config`."""
        return cls(d_model, cls.Config(**(options or {})))

    def resolve(self, x: torch.Tensor) -> str:
        """The concrete backend for this mixer's op on x's device and dtype (kept in `backend_used`)."""
        self.backend_used = resolve_backend(self.op_name, self.config.backend, x.device, x.dtype)
        return self.backend_used

    def value_checks_due(self) -> bool:
        """The op's check_values for this call: True on this instance's first call only.

        A mixer's gates come from parametrisations that keep them valid by construction
        (g = logsigmoid(.) or -exp(A) softplus(.), beta = sigmoid(.)), so the first call
        catches a wiring bug and later calls skip the host sync of the value checks. A gate
        that turns non-finite later (a diverging run) makes the loss non-finite, which the
        training loop records as diverged. Under torch.compile the op skips value checks
        anyway; this returns False there and leaves the flag alone (no attribute write to trace)."""
        if torch.compiler.is_compiling():
            return False
        due = not self.values_checked
        self.values_checked = True
        return due

    def step_backend(self) -> str:
        """Backend for the op's decode step: the PyTorch step when this mixer is pinned to
        "reference" or "torch", else "auto" (the fused Triton step on CUDA when no gradient
        is recorded; kernels.common.dispatch.resolve_step_backend)."""
        return "torch" if self.config.backend in ("reference", "torch") else "auto"

    def decode_backend(self, device: torch.device, dtype: torch.dtype) -> str:
        """The backend a decode step without autograd runs on for inputs on device/dtype:
        "triton" (the fused step) or "torch" (for the record; decoding never records gradients)."""
        if not self.has_fused_step:
            return "torch"
        from kernels.common.dispatch import resolve_step_backend

        with torch.no_grad():
            probe = torch.empty(0, device=device, dtype=dtype)
            return resolve_step_backend(self.op_name + "_step", self.step_backend(), [probe])

    def state_size(self, seq_len: int) -> int:
        """Floats kept per sequence to decode the next token after `seq_len` tokens."""
        raise NotImplementedError

    def step(self, x_t: torch.Tensor, cache: Any) -> tuple[torch.Tensor, Any]:
        """Decode one token: x_t [B, d_model] -> ([B, d_model], new cache)."""
        raise NotImplementedError
