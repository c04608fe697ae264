"""A small language model built from (mixer, MLP) blocks, as in Zoology's recall studies."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from mixers import build_mixer, get_mixer


class ModelConfig(BaseModel):
    """The LM around the mixer; `mixer` holds the mixer's own options (validated by its Config)."""

    model_config = ConfigDict(extra="forbid")

    d_model: int = Field(64, ge=8, description="residual width")
    n_layers: int = Field(2, ge=1, description="number of (mixer, MLP) blocks")
    mlp_ratio: float = Field(2.0, gt=0, description="MLP hidden width / d_model")
    mixer: dict[str, Any] = Field(default_factory=dict, description="mixer options, e.g. num_heads, head_dim")


class Block(nn.Module):
    """x + mixer(norm(x)), then x + MLP(norm(x))."""

    def __init__(self, mixer: nn.Module, d_model: int, mlp_ratio: float):
        super().__init__()
        hidden = max(8, int(round(d_model * mlp_ratio)))
        self.norm1, self.norm2 = nn.RMSNorm(d_model, eps=1e-6), nn.RMSNorm(d_model, eps=1e-6)
        self.mixer = mixer
        self.mlp = nn.Sequential(nn.Linear(d_model, hidden), nn.GELU(), nn.Linear(hidden, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.mixer(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class MixerLM(nn.Module):
    """tokens [B, T] -> hidden [B, T, d_model]; logits only where asked (saves LM-head work)."""

    def __init__(self, mixer_name: str, vocab_size: int, config: ModelConfig):
        super().__init__()
        self.mixer_name, self.vocab_size, self.config = mixer_name, vocab_size, config
        # Validate the mixer options once, with the mixer's own error messages.
        get_mixer(mixer_name).Config(**config.mixer)
        self.embed = nn.Embedding(vocab_size, config.d_model)
        self.blocks = nn.ModuleList(
            Block(build_mixer(mixer_name, config.d_model, config.mixer), config.d_model, config.mlp_ratio)
            for _ in range(config.n_layers)
        )
        self.norm = nn.RMSNorm(config.d_model, eps=1e-6)
        self.head = nn.Linear(config.d_model, vocab_size, bias=False)
        # No LM-wide re-initialisation: every module keeps its own (torch's defaults, and each
        # mixer's deliberate choices such as decay and beta biases). An earlier GPT-style
        # normal(0, 0.02) over every Linear and Embedding left gla, deltanet, gdn and mesa at
        # chance on the MQAR default (1,000 steps, d_model 64): their gate projections started
        # ~6x smaller than torch's 1/sqrt(fan_in) scale and the low-rank / output gates barely
        # moved. With the defaults deltanet reached 0.81 on the same budget (results/runs/mqar).

    def hidden(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B, T] -> final normed hidden states [B, T, d_model]."""
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.norm(x)

    def forward(self, tokens: torch.Tensor, score_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [B, T, vocab], or [N, vocab] at the N positions where score_mask [B, T] is True."""
        h = self.hidden(tokens)
        if score_mask is not None:
            h = h[score_mask]
        return self.head(h)

    def loss(self, tokens: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Cross-entropy on positions with labels != -100; returns (loss, predictions, targets)."""
        mask = labels != -100
        logits = self(tokens, mask)
        targets = labels[mask]
        return F.cross_entropy(logits.float(), targets), logits.argmax(-1), targets

    def backends(self) -> list[str]:
        """The op backend each mixer layer really ran (after a forward)."""
        return [b.mixer.backend_used for b in self.blocks]

    def state_size(self, seq_len: int) -> int:
        """Decode-state floats per sequence summed over layers."""
        return sum(b.mixer.state_size(seq_len) for b in self.blocks)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

