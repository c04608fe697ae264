"""Incremental decoding of a MixerLM: a prompt is run once through every block (each
mixer's `prefill`), then each new token goes through the mixers' `step`, so a linear mixer
decodes in O(1) time and memory per token (softmax keeps its growing KV cache).

These are functions over MixerLM rather than methods, so the model stays a plain module;
they follow `Block.forward` exactly (x + mixer(norm1 x), then the block's `finish`).
A model with learned positions decodes only through `prefill` (a step has no position)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tasks.common.model import MixerLM

# One decode cache per block, as returned by the block's mixer.
Caches = list[Any]


@torch.no_grad()
def prefill(model: MixerLM, tokens: torch.Tensor) -> tuple[torch.Tensor, Caches]:
    """Run a prompt tokens [B, T] (T >= 1); returns (logits at its last position [B, vocab], caches)."""
    if tokens.dim() != 2 or tokens.shape[1] < 1:
        raise ValueError(f"tokens must be [B, T] with T >= 1, got shape {tuple(tokens.shape)}")
    x = model.embed_tokens(tokens)
    caches: Caches = []
    for block in model.blocks:
        mixed, cache = block.mixer.prefill(block.norm1(x))
        x = block.finish(x + mixed)
        caches.append(cache)
    return model.head(model.norm(x[:, -1])), caches


@torch.no_grad()
def decode_step(model: MixerLM, token: torch.Tensor, caches: Caches) -> tuple[torch.Tensor, Caches]:
    """Feed one token per sequence, token [B]; returns (logits for the next token [B, vocab], caches)."""
    if len(caches) != len(model.blocks):
        raise ValueError(f"caches holds {len(caches)} entries for a model of {len(model.blocks)} blocks")
    if model.max_positions:
        raise ValueError("decode_step: this model has learned position embeddings; a step carries no position")
    x = model.embed_tokens(token)
    new_caches: Caches = []
    for block, cache in zip(model.blocks, caches):
        mixed, cache = block.mixer.step(block.norm1(x), cache)
        x = block.finish(x + mixed)
        new_caches.append(cache)
    return model.head(model.norm(x)), new_caches


@torch.no_grad()
def greedy_decode(
    model: MixerLM,
    prompt: torch.Tensor,
    max_new_tokens: int,
    should_stop: Callable[[int, list[int]], bool] | None = None,
) -> list[list[int]]:
    """Greedy continuation of each row of prompt [B, T] by prefill then one step per token.

    should_stop(row, generated_tokens) -> True ends that row (its last token is kept; the
    caller trims). Decoding ends when every row stopped or after max_new_tokens tokens.
    Returns the generated tokens of each row."""
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    batch = prompt.shape[0]
    generated: list[list[int]] = [[] for _ in range(batch)]
    if max_new_tokens == 0:
        return generated
    logits, caches = prefill(model, prompt)
    active = [True] * batch
    for step in range(max_new_tokens):
        token = logits.argmax(-1)
        for row, value in enumerate(token.tolist()):
            if active[row]:
                generated[row].append(value)
                if should_stop is not None and should_stop(row, generated[row]):
                    active[row] = False
        if not any(active) or step == max_new_tokens - 1:
            break
        logits, caches = decode_step(model, token, caches)
    return generated
