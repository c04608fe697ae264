"""Model-level pieces of the fidelity task: capture the q, k, v a trained softmax model feeds
its attention ops, and swap its attention for another op with the same weights."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch

from kernels import resolve_backend
from tasks.common.model import MixerLM
from tasks.common.training import predict
from tasks.fidelity_math import diag_rnn_attention, lin_gdn_balanced_op


@dataclass(frozen=True)
class Swap:
    """How an op runs inside the trained softmax model.

    mixer: a registered mixer with exactly softmax's parameters, built with `options` and
    loaded with the softmax state_dict; or None, when no mixer runs the op and `patch`
    names an op patched into the softmax layers ("diag_rnn", "lin_gdn_bal")."""

    mixer: str | None
    options: dict = field(default_factory=dict)
    patch: str | None = None


def capture_qkv(model: MixerLM, tokens: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Run the model on tokens [N, T] and return the (q, k, v) [N, T, H, D] each layer's op received."""
    captured = []

    def recorder(original):
        def run_op(q, k, v, gates, initial_state=None, output_final_state=False):
            captured.append((q.detach(), k.detach(), v.detach()))
            return original(q, k, v, gates, initial_state=initial_state, output_final_state=output_final_state)
        return run_op

    try:
        for block in model.blocks:
            block.mixer.run_op = recorder(block.mixer.run_op)
        with torch.no_grad():
            model.eval()
            model.hidden(tokens)
            model.train()
    finally:
        for block in model.blocks:
            block.mixer.__dict__.pop("run_op", None)  # back to the class method
    return captured


def swapped_model(softmax_model: MixerLM, swap: Swap, balance: list[torch.Tensor] | None = None) -> MixerLM:
    """The trained softmax model with its attention replaced, weights unchanged.

    balance: per layer, the factor c [H] of lin_gdn_bal (calibrated on captured q, k)."""
    if swap.mixer is None:
        model = copy.deepcopy(softmax_model)
        for i, block in enumerate(model.blocks):
            block.mixer.run_op = _patched_op(swap.patch, None if balance is None else balance[i])
        return model
    # the softmax model's mixer options, less its backend (softmax has flash_attn, the others not)
    options = {k: v for k, v in softmax_model.config.mixer.items() if k != "backend"}
    model_cfg = softmax_model.config.model_copy(update={"mixer": {**options, **swap.options}})
    model = MixerLM(swap.mixer, softmax_model.vocab_size, model_cfg, max_positions=softmax_model.max_positions)
    model.load_state_dict(softmax_model.state_dict(), strict=True)  # the same parameters as softmax
    return model.to(next(softmax_model.parameters()).device)


def _patched_op(name: str | None, factor: torch.Tensor | None):
    """A run_op for the softmax layer (same signature) that computes op `name` instead."""
    if name == "diag_rnn":
        def run_op(q, k, v, gates, initial_state=None, output_final_state=False):
            return diag_rnn_attention(q, k, v), None
    elif name == "lin_gdn_bal":
        if factor is None:
            raise ValueError("lin_gdn_bal needs the per-layer balance factors calibrated on captured q, k")

        def run_op(q, k, v, gates, initial_state=None, output_final_state=False):
            backend = resolve_backend("linearized_softmax_gdn", "auto", q.device)
            return lin_gdn_balanced_op(q, k, v, None, backend, factor=factor.to(q.device)), None
    else:
        raise ValueError(f"no patch for op {name!r}; valid: diag_rnn, lin_gdn_bal")
    return run_op


def qk_stats(q: torch.Tensor, k: torch.Tensor) -> dict[str, float]:
    """Scale of a layer's attention: std of the causal logits q'.k and the mean norms of q', k."""
    qs = q.double() * q.shape[-1] ** -0.5
    logits = torch.einsum("bthd,bshd->bhts", qs, k.double())
    T = q.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    return {"logit_std": float(logits[..., causal].std()), "q_norm": float(qs.norm(dim=-1).mean()),
            "k_norm": float(k.double().norm(dim=-1).mean())}


def mqar_accuracy(model: MixerLM, blocks, batch_size: int, device: torch.device) -> float:
    """MQAR accuracy over all recalled values of the (inputs, labels) test blocks."""
    hits = scored = 0
    for x, y in blocks:
        correct = predict(model, x, y, batch_size, device)
        hits += int(correct.sum())
        scored += int((y != -100).sum())
    return hits / scored
