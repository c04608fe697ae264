"""Training and evaluation of a MixerLM on (inputs, labels) token tensors.

Labels hold -100 wherever no prediction is scored, so loss and accuracy count only the
recall positions. Shared by MQAR and NIAH so both tasks train the same way."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from tasks.base import RunContext
from tasks.common.model import MixerLM


class TrainConfig(BaseModel):
    """Optimiser, schedule and stopping rule. Defaults: AdamW (0.9, 0.98), weight decay on
    matrices only, linear warm-up then cosine decay per step, gradient clipping at 1.0.
    Zoology's recipe is betas (0.9, 0.999), decay_all, schedule "epoch_cosine", no clipping."""

    model_config = ConfigDict(extra="forbid")

    epochs: int = Field(8, ge=1)
    batch_size: int = Field(64, ge=1)
    lr: float = Field(1e-2, gt=0)
    weight_decay: float = Field(0.1, ge=0)
    betas: tuple[float, float] = Field((0.9, 0.98), description="AdamW betas")
    decay_all: bool = Field(False, description="weight decay on every parameter (Zoology); else matrices only, no embeddings")
    schedule: Literal["warmup_cosine", "epoch_cosine"] = Field(
        "warmup_cosine", description="warmup_cosine: linear warm-up then cosine per step; epoch_cosine: cosine "
        "over epochs, stepped once an epoch, no warm-up (Zoology)")
    warmup_frac: float = Field(0.1, ge=0, lt=1, description="warm-up share of the steps (warmup_cosine)")
    grad_clip: float | None = Field(1.0, gt=0, description="clip the gradient norm; null: no clipping")
    early_stop: float | None = Field(
        None, gt=0, le=1, description="evaluate after every epoch and stop once accuracy >= this (Zoology: 0.99)")
    eval_batch_size: int = Field(256, ge=1)

    @field_validator("betas")
    @classmethod
    def _betas_in_range(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not all(0 <= b < 1 for b in v):
            raise ValueError(f"betas must each be in [0, 1), got {v}")
        return v


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite."""


@dataclass
class TrainStats:
    """What a training run did: steps and epochs run, why it stopped, its eval curve."""

    steps: int
    final_loss: float
    train_time_s: float
    epochs: int = 0
    stop_reason: str = "epochs"  # "epochs" (all run) or "early_stop" (target accuracy reached)
    eval_curve: list[dict[str, float]] = field(default_factory=list)  # [{epoch, step, accuracy}]
    eval_time_s: float = 0.0  # the per-epoch evaluations' share of the wall time (not in train_time_s)


def lr_at(step: int, total: int, cfg: TrainConfig, epoch: int = 0) -> float:
    """Learning rate at `step` of `total` (in `epoch`): warm-up + cosine per step, or cosine per epoch."""
    if cfg.schedule == "epoch_cosine":
        return cfg.lr * 0.5 * (1.0 + math.cos(math.pi * epoch / cfg.epochs))
    warm = max(1, int(cfg.warmup_frac * total))
    if step < warm:
        return cfg.lr * (step + 1) / warm
    progress = (step - warm) / max(1, total - warm)
    return cfg.lr * 0.5 * (1.0 + math.cos(math.pi * progress))


Blocks = Sequence[tuple[torch.Tensor, torch.Tensor]]


def epoch_batches(blocks: Blocks, batch_size: int, gen: torch.Generator) -> list[tuple[int, torch.Tensor]]:
    """One epoch's batches as (block index, row indices): rows shuffled within each block, every
    batch from one block, and (with several blocks) the batch order shuffled across blocks."""
    batches = []
    for b, (inputs, _) in enumerate(blocks):
        order = torch.randperm(inputs.shape[0], generator=gen)
        batches += [(b, order[i : i + batch_size]) for i in range(0, inputs.shape[0], batch_size)]
    if len(blocks) > 1:
        batches = [batches[i] for i in torch.randperm(len(batches), generator=gen).tolist()]
    return batches


def _non_finite_parameters(model: MixerLM) -> list[str]:
    """Names of the parameters holding a NaN or an infinity."""
    return [name for name, p in model.named_parameters() if not torch.isfinite(p).all()]


def _optimizer(model: MixerLM, cfg: TrainConfig) -> torch.optim.Optimizer:
    if cfg.decay_all:
        groups = [{"params": list(model.parameters()), "weight_decay": cfg.weight_decay}]
    else:
        named = list(model.named_parameters())
        decayed = [p for name, p in named if p.dim() >= 2 and "embed" not in name]
        kept = [p for name, p in named if not (p.dim() >= 2 and "embed" not in name)]
        groups = [{"params": decayed, "weight_decay": cfg.weight_decay}, {"params": kept, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas)


def train(model: MixerLM, blocks: Blocks, cfg: TrainConfig, ctx: RunContext,
          evaluate: Callable[[], float] | None = None) -> TrainStats:
    """Train in place on blocks of (inputs, labels) [N_b, T_b] tensors, each batch from one block.

    evaluate() -> accuracy runs after every epoch when cfg.early_stop is set (it is then
    required); training stops once it reaches cfg.early_stop. Logs loss and lr through ctx.log."""
    if cfg.early_stop is not None and evaluate is None:
        raise ValueError("optim.early_stop is set but this task has no evaluation to stop on")
    device = ctx.device
    steps_per_epoch = sum(math.ceil(x.shape[0] / cfg.batch_size) for x, _ in blocks)
    total = steps_per_epoch * cfg.epochs
    opt = _optimizer(model, cfg)
    gen = torch.Generator().manual_seed(ctx.seed)
    bar = ctx.progress.add_task(f"train {ctx.mixer}", total=total)
    model.train()
    start, step, loss_value = time.perf_counter(), 0, float("nan")
    stats = TrainStats(steps=0, final_loss=loss_value, train_time_s=0.0)
    for epoch in range(cfg.epochs):
        for b, idx in epoch_batches(blocks, cfg.batch_size, gen):
            inputs, labels = blocks[b]
            x, y = inputs[idx].to(device), labels[idx].to(device)
            for group in opt.param_groups:
                group["lr"] = lr_at(step, total, cfg, epoch)
            try:
                loss, _, _ = model.loss(x, y)
            except ValueError as e:
                # A NaN weight reaches the ops' input checks (a gate "must be <= 0") before the
                # loss: name the divergence, not the symptom.
                bad = _non_finite_parameters(model)
                if bad:
                    raise TrainingDiverged(
                        f"parameters became non-finite before step {step} (epoch {epoch}): "
                        f"{', '.join(bad[:3])}; try a lower lr") from e
                raise
            if not torch.isfinite(loss):
                raise TrainingDiverged(f"loss became {loss.item()} at step {step} (epoch {epoch}); try a lower lr")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            step += 1
            loss_value = loss.item()
            ctx.progress.update(bar, advance=1, description=f"train {ctx.mixer} loss {loss_value:.3f}")
            if step % 50 == 0 or step == total:
                ctx.log({"train/loss": loss_value, "train/lr": opt.param_groups[0]["lr"]}, step)
        stats.epochs = epoch + 1
        if cfg.early_stop is not None:
            eval_start = time.perf_counter()
            accuracy = evaluate()
            stats.eval_time_s += time.perf_counter() - eval_start
            stats.eval_curve.append({"epoch": epoch + 1, "step": step, "accuracy": accuracy})
            ctx.log({"eval/accuracy": accuracy}, step)
            ctx.progress.update(bar, description=f"train {ctx.mixer} epoch {epoch + 1} accuracy {accuracy:.3f}")
            if accuracy >= cfg.early_stop:
                stats.stop_reason = "early_stop"
                break
    ctx.progress.remove_task(bar)
    stats.steps, stats.final_loss = step, loss_value
    stats.train_time_s = time.perf_counter() - start - stats.eval_time_s
    return stats


@torch.no_grad()
def predict(model: MixerLM, inputs: torch.Tensor, labels: torch.Tensor, batch_size: int, device: torch.device) -> torch.Tensor:
    """Correctness [N, T] (bool) of the argmax prediction at every scored position (False elsewhere)."""
    model.eval()
    correct = torch.zeros(labels.shape, dtype=torch.bool)
    for start in range(0, inputs.shape[0], batch_size):
        x = inputs[start : start + batch_size].to(device)
        y = labels[start : start + batch_size].to(device)
        mask = y != -100
        pred = model(x, mask).argmax(-1)
        block = torch.zeros(y.shape, dtype=torch.bool, device=device)
        block[mask] = pred == y[mask]
        correct[start : start + batch_size] = block.cpu()
    model.train()
    return correct
