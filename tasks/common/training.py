"""Training and evaluation of a MixerLM on (inputs, labels) token tensors.

Labels hold -100 wherever no prediction is scored, so loss and accuracy count only the
recall positions. Shared by MQAR and NIAH so both tasks train the same way."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
from pydantic import BaseModel, ConfigDict, Field

from tasks.base import RunContext
from tasks.common.model import MixerLM


class TrainConfig(BaseModel):
    """Optimiser and schedule: AdamW, linear warm-up then cosine decay to zero."""

    model_config = ConfigDict(extra="forbid")

    epochs: int = Field(8, ge=1)
    batch_size: int = Field(64, ge=1)
    lr: float = Field(1e-2, gt=0)
    weight_decay: float = Field(0.1, ge=0)
    warmup_frac: float = Field(0.1, ge=0, lt=1)
    grad_clip: float = Field(1.0, gt=0)
    eval_batch_size: int = Field(256, ge=1)


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite."""


@dataclass
class TrainStats:
    steps: int
    final_loss: float
    train_time_s: float


def lr_at(step: int, total: int, cfg: TrainConfig) -> float:
    """Learning rate at `step` of `total`: linear warm-up then cosine to zero."""
    warm = max(1, int(cfg.warmup_frac * total))
    if step < warm:
        return cfg.lr * (step + 1) / warm
    progress = (step - warm) / max(1, total - warm)
    return cfg.lr * 0.5 * (1.0 + math.cos(math.pi * progress))


def train(model: MixerLM, inputs: torch.Tensor, labels: torch.Tensor, cfg: TrainConfig, ctx: RunContext) -> TrainStats:
    """Train in place on inputs/labels [N, T] (on ctx.device); logs loss and lr through ctx.log."""
    device = ctx.device
    n = inputs.shape[0]
    steps_per_epoch = math.ceil(n / cfg.batch_size)
    total = steps_per_epoch * cfg.epochs
    decay = [p for name, p in model.named_parameters() if p.dim() >= 2 and "embed" not in name]
    no_decay = [p for name, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in name)]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=(0.9, 0.98),
    )
    gen = torch.Generator().manual_seed(ctx.seed)
    bar = ctx.progress.add_task(f"train {ctx.mixer}", total=total)
    model.train()
    start, step, loss_value = time.perf_counter(), 0, float("nan")
    for epoch in range(cfg.epochs):
        order = torch.randperm(n, generator=gen)
        for i in range(steps_per_epoch):
            idx = order[i * cfg.batch_size : (i + 1) * cfg.batch_size]
            x, y = inputs[idx].to(device), labels[idx].to(device)
            for group in opt.param_groups:
                group["lr"] = lr_at(step, total, cfg)
            loss, _, _ = model.loss(x, y)
            if not torch.isfinite(loss):
                raise TrainingDiverged(f"loss became {loss.item()} at step {step} (epoch {epoch}); try a lower lr")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            step += 1
            loss_value = loss.item()
            ctx.progress.update(bar, advance=1, description=f"train {ctx.mixer} loss {loss_value:.3f}")
            if step % 50 == 0 or step == total:
                ctx.log({"train/loss": loss_value, "train/lr": opt.param_groups[0]["lr"]}, step)
    ctx.progress.remove_task(bar)
    return TrainStats(steps=step, final_loss=loss_value, train_time_s=time.perf_counter() - start)


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
