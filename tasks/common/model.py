"""A small language model of mixer blocks, as in Zoology's recall studies."""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, field_validator
from torch import nn

from mixers import build_mixer, get_mixer
from tasks.common.base_conv import BaseConv


class ModelConfig(BaseModel):
    """The LM around the mixer; `mixer` holds the mixer's own options (validated by its Config).

    The defaults are our own small LM (RMSNorm, mixer + MLP blocks, torch's init). The other
    values reproduce Zoology's MQAR model: LayerNorm, `state_mixer="identity"`, a BaseConv in
    front of the mixer, tied embeddings, N(0, 0.02) init (and, as its older configs did,
    learned positions for attention)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # inf or nan is never a valid setting

    d_model: int = Field(64, ge=8, description="residual width")
    n_layers: int = Field(2, ge=1, description="number of blocks")
    mlp_ratio: float = Field(2.0, gt=0, description="MLP hidden width / d_model")
    mixer: dict[str, Any] = Field(default_factory=dict, description="mixer options, e.g. num_heads, head_dim")
    per_mixer: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="options for one mixer only, over `mixer` (e.g. {gdn: {expand_v: 2}})")
    norm: Literal["rms", "layer"] = Field("rms", description="RMSNorm or LayerNorm before each sub-layer and at the end")
    state_mixer: Literal["mlp", "identity", "none"] = Field(
        "mlp", description="second half of a block: x + MLP(norm x); identity: x + norm x (Zoology's MQAR "
        "models, whose state mixer is nn.Identity); none: no second half")
    base_conv: bool = Field(
        False, description="even layers are a BaseConv (gated short conv) instead of the mixer (Zoology's Hybrid)")
    base_conv_size: int = Field(3, ge=1, le=16, description="BaseConv kernel width")
    position_embeddings: Literal["none", "attention", "all"] = Field(
        "none", description="learned absolute positions: never, for softmax attention only, or for every mixer")
    tie_embeddings: bool = Field(False, description="the LM head shares the token embedding matrix")
    embed_dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the embeddings")
    init_std: float | None = Field(
        None, gt=0, description="re-initialise every Linear and Embedding weight as N(0, init_std), biases 0 "
        "(Zoology and GPT use 0.02); null: each module keeps its own init")

    @field_validator("per_mixer")
    @classmethod
    def _known_mixers(cls, v: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        for name in v:
            get_mixer(name)  # UnknownMixerError names the valid ones
        return v

    def mixer_options(self, mixer_name: str) -> dict[str, Any]:
        """The options mixer `mixer_name` is built with: `mixer`, then its `per_mixer` entry."""
        return {**self.mixer, **self.per_mixer.get(mixer_name, {})}


# `per_mixer` options: the RMSNorm without the SiLU output gate, for the mixers that have the
# gate by default (Zoology's DeltaNet and GDN layers; results/ablations/README.md).
UNGATED_OUTPUT: dict[str, dict[str, Any]] = {
    name: {"output_gate": False, "output_norm": True} for name in ("gla", "deltanet", "gdn", "mesa")}


class Block(nn.Module):
    """x + mixer(norm(x)), then the state mixer: x + MLP(norm(x)), x + norm(x) or nothing."""

    def __init__(self, mixer: nn.Module, config: ModelConfig):
        super().__init__()
        d_model = config.d_model
        self.norm1 = _norm(config)
        if config.state_mixer != "none":
            self.norm2 = _norm(config)
        self.mixer = mixer
        self.state_mixer = config.state_mixer
        if config.state_mixer == "mlp":
            hidden = max(8, int(round(d_model * config.mlp_ratio)))
            self.mlp = nn.Sequential(nn.Linear(d_model, hidden), nn.GELU(), nn.Linear(hidden, d_model))

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        """The block's second half on x [..., d_model] (shared by forward and decoding)."""
        if self.state_mixer == "mlp":
            return x + self.mlp(self.norm2(x))
        if self.state_mixer == "identity":
            return x + self.norm2(x)
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.finish(x + self.mixer(self.norm1(x)))


def _norm(config: ModelConfig) -> nn.Module:
    if config.norm == "layer":
        return nn.LayerNorm(config.d_model, eps=1e-5)
    return nn.RMSNorm(config.d_model, eps=1e-6)


def scored_positions(labels: torch.Tensor, scored: int) -> torch.Tensor:
    """Flat indices [scored] of the positions where labels [B, T] != -100, in order.

    A scatter by running count instead of nonzero, so the output size is known without reading
    the device. `scored` must be the true count."""
    flat = labels.reshape(-1) != -100
    rank = flat.long().cumsum(0) - 1
    slot = torch.where(flat, rank, torch.full_like(rank, scored))  # unscored positions land past the end
    where = torch.empty(scored + 1, dtype=torch.long, device=labels.device)
    where.scatter_(0, slot, torch.arange(flat.numel(), device=labels.device))
    return where[:scored]


class MixerLM(nn.Module):
    """tokens [B, T] -> hidden [B, T, d_model]; logits only where asked (saves LM-head work).

    max_positions: the longest sequence the learned position table covers (needed only
    when config.position_embeddings applies to this mixer)."""

    def __init__(self, mixer_name: str, vocab_size: int, config: ModelConfig, max_positions: int = 0):
        super().__init__()
        self.mixer_name, self.vocab_size, self.config = mixer_name, vocab_size, config
        # Validate the mixer options once, with the mixer's own error messages.
        get_mixer(mixer_name).Config(**config.mixer_options(mixer_name))
        self.embed = nn.Embedding(vocab_size, config.d_model)
        uses_positions = config.position_embeddings == "all" or (
            config.position_embeddings == "attention" and mixer_name == "softmax")
        self.max_positions = max_positions if uses_positions else 0
        if uses_positions:
            if max_positions < 1:
                raise ValueError(f"position_embeddings={config.position_embeddings!r} needs max_positions >= 1")
            self.pos_embed = nn.Embedding(max_positions, config.d_model)
        self.embed_dropout = nn.Dropout(config.embed_dropout)
        self.blocks = nn.ModuleList(
            Block(self._layer(i, mixer_name, config), config) for i in range(config.n_layers)
        )
        self.norm = _norm(config)
        self.head = nn.Linear(config.d_model, vocab_size, bias=False)
        if config.init_std is not None:
            self._normal_init(config.init_std)
        # Tied after init so the shared matrix gets the embedding's init.
        if config.tie_embeddings:
            self.head.weight = self.embed.weight
        # By default there is no LM-wide re-initialisation: every module keeps its own (torch's
        # defaults, and each mixer's deliberate choices such as decay and beta biases).

    @staticmethod
    def _layer(index: int, mixer_name: str, config: ModelConfig) -> nn.Module:
        if config.base_conv and index % 2 == 0:
            return BaseConv(config.d_model, config.base_conv_size)
        return build_mixer(mixer_name, config.d_model, config.mixer_options(mixer_name))

    def _normal_init(self, std: float) -> None:
        """N(0, std) on every Linear and Embedding weight, zero biases; other parameters
        (convolutions, norms, decay parameters) keep their own init, as in Zoology."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def embed_tokens(self, tokens: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """tokens [B, T] (positions offset .. offset+T-1) -> embeddings [B, T, d_model]."""
        x = self.embed(tokens)
        if self.max_positions:
            end = offset + tokens.shape[-1]
            if end > self.max_positions:
                raise ValueError(f"position {end - 1} is past the position table ({self.max_positions} positions)")
            x = x + self.pos_embed(torch.arange(offset, end, device=tokens.device))
        return self.embed_dropout(x)

    def hidden(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B, T] -> final normed hidden states [B, T, d_model]."""
        x = self.embed_tokens(tokens)
        for block in self.blocks:
            x = block(x)
        return self.norm(x)

    def forward(self, tokens: torch.Tensor, score_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [B, T, vocab], or [N, vocab] at the N positions where score_mask [B, T] is True."""
        h = self.hidden(tokens)
        if score_mask is not None:
            h = h[score_mask]
        return self.head(h)

    def loss(self, tokens: torch.Tensor, labels: torch.Tensor,
             scored: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Cross-entropy on positions with labels != -100; returns (loss, predictions, targets).

        tokens, labels: [B, T]. scored: the number of such positions when the caller knows it;
        the positions are then found without a host sync (CUDA-graph capture needs this)."""
        if scored is not None:
            return self.loss_at(tokens, labels, scored_positions(labels, scored))
        mask = labels != -100
        logits = self(tokens, mask)
        targets = labels[mask]
        return F.cross_entropy(logits.float(), targets), logits.argmax(-1), targets

    def loss_at(self, tokens: torch.Tensor, labels: torch.Tensor,
                where: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """loss with the scored positions given: where [N] indexes the flattened [B * T] labels
        (scored_positions). Its shapes follow the tensors alone, so torch.compile can treat the
        batch and the scored count as dynamic."""
        h = self.hidden(tokens)
        logits = self.head(h.reshape(-1, h.shape[-1]).index_select(0, where))
        targets = labels.reshape(-1).index_select(0, where)
        return F.cross_entropy(logits.float(), targets), logits.argmax(-1), targets

    @classmethod
    def from_pretrained(cls, path: str, device: torch.device | str = "cpu") -> MixerLM:
        """The model of a checkpoint folder (config.json + model.safetensors, as save_checkpoint
        writes it; a legacy checkpoint.pt too), in eval mode on `device`."""
        from tasks.common.checkpoint import load_checkpoint  # the checkpoint module builds on this one

        return load_checkpoint(path, device).model

    def backends(self) -> list[str]:
        """The op backend each mixer layer really ran (after a forward)."""
        return [b.mixer.backend_used for b in self.blocks if not isinstance(b.mixer, BaseConv)]

    def state_size(self, seq_len: int) -> int:
        """Decode-state floats per sequence summed over layers."""
        return sum(b.mixer.state_size(seq_len) for b in self.blocks)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

