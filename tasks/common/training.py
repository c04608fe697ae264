"""Training and evaluation of a MixerLM on (inputs, labels) token tensors.

Labels hold -100 wherever no prediction is scored, so loss and accuracy count only the
recall positions. Shared by MQAR and NIAH so both tasks train the same way."""

from __future__ import annotations

import contextlib
import itertools
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from tasks.base import RunContext, RunDiverged
from tasks.common.graphed_step import GraphedSteps, make_capturable_adamw, new_shapes_seconds, optimizer_step, set_lr
from tasks.common.model import MixerLM, scored_positions
from tasks.common.resume import SavedProgress, load_state, save_state

LOSS_READ_EVERY = 25  # graphed steps between host reads of the loss


class TrainConfig(BaseModel):
    """Optimiser, schedule and stopping rule. Defaults: AdamW (0.9, 0.98), weight decay on
    matrices only, linear warm-up then cosine decay per step, gradient clipping at 1.0.
    Zoology's recipe is betas (0.9, 0.999), decay_all, schedule "epoch_cosine", no clipping."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # inf or nan is never a valid setting

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
    cuda_graph: bool | Literal["auto"] = Field(
        False, description="replay each training step as a CUDA graph (one launch a step): true needs a CUDA "
        "device, auto uses graphs on CUDA and eager steps elsewhere")
    compile: bool = Field(
        False, description="torch.compile the training step's forward and backward (one graph per sequence "
        "length, the batch dynamic; Inductor fuses the chunkwise ops' elementwise passes). An execution "
        "choice like cuda_graph: it changes rounding, not the experiment, so it is not part of a run's key")
    matmul_precision: Literal["highest", "high"] = Field(
        "highest", description="float32 matrix products while training and scoring: highest is true fp32 "
        "(Zoology); high lets CUDA use TF32 tensor cores (10 mantissa bits per input, fp32 sums)")

    @field_validator("betas")
    @classmethod
    def _betas_in_range(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not all(0 <= b < 1 for b in v):
            raise ValueError(f"betas must each be in [0, 1), got {v}")
        return v


class TrainingDiverged(RunDiverged):
    """The loss or the weights became NaN or infinite."""


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
    step_mode: str = "eager"  # "eager" or "cuda_graph"
    graph_steps: int = 0  # steps replayed from a CUDA graph (the rest ran eagerly)
    graphs: int = 0  # batch shapes captured
    compiled: bool = False  # the loss ran under torch.compile (optim.compile)
    new_shapes: list[dict[str, float]] = field(default_factory=list)  # GraphedSteps.new_shapes
    resumed_at_epoch: int | None = None  # epochs a previous, cut-short run had finished (tasks.common.resume)

    @property
    def new_shape_s(self) -> float:
        """This process's first steps of each batch shape (compile, capture), in seconds."""
        return new_shapes_seconds(self.new_shapes)


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


def _optimizer(model: MixerLM, cfg: TrainConfig, graphed: bool = False,
               device: torch.device | None = None) -> torch.optim.Optimizer:
    if cfg.decay_all:
        groups = [{"params": list(model.parameters()), "weight_decay": cfg.weight_decay}]
    else:
        named = list(model.named_parameters())
        decayed = [p for name, p in named if p.dim() >= 2 and "embed" not in name]
        kept = [p for name, p in named if not (p.dim() >= 2 and "embed" not in name)]
        groups = [{"params": decayed, "weight_decay": cfg.weight_decay}, {"params": kept, "weight_decay": 0.0}]
    if graphed:
        return make_capturable_adamw(groups, cfg.lr, cfg.betas, device)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas)


@contextlib.contextmanager
def float32_matmul(precision: str) -> Iterator[None]:
    """torch's float32 matmul precision set to `precision` inside the block, restored after."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


COMPILED_SHAPES = 64  # graphs a compiled loss keeps before dynamo gives up on a new one


def compiled_loss(model: MixerLM) -> Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """model.loss with its forward and backward under torch.compile: one graph per sequence
    length, the batch dimension and the scored count dynamic (a recall task's settings differ
    in length, and each one's last batch is partial). The sequence length stays static: the
    chunkwise ops' state pass is a Python loop over chunks. Evaluation keeps the eager model.

    A batch narrower than the widest one so far is padded to it with unscored rows (token 0,
    labels -100), which leave the loss and every gradient as they are: Inductor's code for a
    dynamic batch holds guards on its size (on the CPU `33 <= batch`; on an H200 the gated delta
    rule's graphs compiled again for each setting's last batch of 32 rows, about 30 s each),
    and the padded step reuses the full batch's graph. Dropout draws masks for the padded rows
    too, so a partial batch's masks differ from an unpadded step's."""
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, COMPILED_SHAPES)
    inner = torch.compile(model.loss_at)
    widest = 0

    def loss(tokens: torch.Tensor, labels: torch.Tensor,
             scored: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        nonlocal widest
        if scored is None:  # eager steps count on the host; graphed steps pass the count
            scored = int((labels != -100).sum())
        rows = tokens.shape[0]
        if rows < widest:
            tokens = torch.nn.functional.pad(tokens, (0, 0, 0, widest - rows))
            labels = torch.nn.functional.pad(labels, (0, 0, 0, widest - rows), value=-100)
        widest = max(widest, rows)
        where = scored_positions(labels, scored)
        for t in (tokens, labels, where):
            torch._dynamo.mark_dynamic(t, 0)
        for t in (tokens, labels):  # a new length is a new graph, not a dynamic length
            torch._dynamo.mark_static(t, 1)
        return inner(tokens, labels, where)

    return loss


def uses_cuda_graph(cfg: TrainConfig, device: torch.device) -> bool:
    """Whether training steps are graphed on `device`; true without CUDA is an error."""
    if cfg.cuda_graph is True and device.type != "cuda":
        raise ValueError(f"optim.cuda_graph=true needs a CUDA device, got {device}; use auto or false")
    return cfg.cuda_graph is not False and device.type == "cuda"


def _diverged_from(error: ValueError, model: MixerLM, step: int, epoch: int) -> Exception:
    """A NaN weight reaches the ops' input checks (a gate "must be <= 0") before the loss:
    name the divergence, not the symptom."""
    bad = _non_finite_parameters(model)
    if not bad:
        return error
    return TrainingDiverged(
        f"parameters became non-finite before step {step} (epoch {epoch}): {', '.join(bad[:3])}; try a lower lr")


def train(model: MixerLM, blocks: Blocks, cfg: TrainConfig, ctx: RunContext,
          evaluate: Callable[[], float] | None = None) -> TrainStats:
    """Train in place on blocks of (inputs, labels) [N_b, T_b] tensors, each batch from one block.

    evaluate() -> accuracy runs after every epoch when cfg.early_stop is set (it is then
    required); training stops once it reaches cfg.early_stop. Logs loss and lr through ctx.log.
    With CUDA graphs (cfg.cuda_graph) the blocks move to the GPU once and the loss is read every
    LOSS_READ_EVERY steps, so divergence is reported within that many steps. Matrix products run
    at cfg.matmul_precision, the per-epoch evaluations included."""
    if cfg.early_stop is not None and evaluate is None:
        raise ValueError("optim.early_stop is set but this task has no evaluation to stop on")
    with float32_matmul(cfg.matmul_precision):
        return _train_epochs(model, blocks, cfg, ctx, evaluate)


def _train_epochs(model: MixerLM, blocks: Blocks, cfg: TrainConfig, ctx: RunContext,
                  evaluate: Callable[[], float] | None) -> TrainStats:
    device = ctx.device
    graphed = uses_cuda_graph(cfg, device)
    steps_per_epoch = sum(math.ceil(x.shape[0] / cfg.batch_size) for x, _ in blocks)
    total = steps_per_epoch * cfg.epochs
    opt = _optimizer(model, cfg, graphed, device)
    loss_fn = compiled_loss(model) if cfg.compile else model.loss
    runner = GraphedSteps(model, opt, cfg.grad_clip, loss_fn) if graphed else None
    if graphed:
        scored_per_row = [(y != -100).sum(1) for _, y in blocks]  # on the host: no sync per batch
        blocks = [(x.to(device), y.to(device)) for x, y in blocks]
    gen = torch.Generator().manual_seed(ctx.seed)
    step, loss_value = 0, float("nan")
    stats = TrainStats(steps=0, final_loss=loss_value, train_time_s=0.0, step_mode="cuda_graph" if graphed else "eager")
    saved = load_state(ctx.resume_dir, model, opt, gen, total, device)
    done_before = 0.0  # training seconds of the runs this one resumes
    if saved is not None:
        step, loss_value, done_before = saved.step, saved.loss, saved.train_time_s
        stats.epochs, stats.eval_time_s, stats.eval_curve = saved.epoch, saved.eval_time_s, list(saved.eval_curve)
        stats.stop_reason, stats.resumed_at_epoch, stats.graph_steps = saved.stop_reason, saved.epoch, saved.graph_steps
    first_epoch = stats.epochs if stats.stop_reason == "epochs" else cfg.epochs
    start, eval_before = time.perf_counter(), stats.eval_time_s

    def trained_s() -> float:  # training seconds so far, resumed runs' included, evaluations not
        return done_before + time.perf_counter() - start - (stats.eval_time_s - eval_before)

    def graph_steps() -> int:  # replayed steps so far, resumed runs' included
        return stats.graph_steps + (runner.graph_steps if runner is not None else 0)

    bar = ctx.progress.add_task(f"train {ctx.mixer}", total=total)
    if step:
        ctx.progress.update(bar, completed=step, description=f"train {ctx.mixer} (resumed at epoch {stats.epochs})")
    model.train()
    for epoch in range(first_epoch, cfg.epochs):
        batches = epoch_batches(blocks, cfg.batch_size, gen)
        if graphed:
            # One host-to-device copy of the epoch's row indices instead of one per batch.
            flat = torch.cat([idx for _, idx in batches]).to(device)
            offsets = [0, *itertools.accumulate(len(idx) for _, idx in batches)]
        for n, (b, idx) in enumerate(batches):
            inputs, labels = blocks[b]
            set_lr(opt, lr_at(step, total, cfg, epoch))
            if graphed:
                rows = flat[offsets[n] : offsets[n + 1]]
                x, y = inputs.index_select(0, rows), labels.index_select(0, rows)
                try:
                    loss = runner.step(x, y, int(scored_per_row[b][idx].sum()))
                except ValueError as e:
                    raise _diverged_from(e, model, step, epoch) from e
                step += 1
                if step % LOSS_READ_EVERY == 0 or step % ctx.log_every == 0 or step == total:
                    loss_value = _read_loss(loss, step, epoch)
            else:
                x, y = inputs[idx].to(device), labels[idx].to(device)
                try:
                    loss, _, _ = loss_fn(x, y)
                except ValueError as e:
                    raise _diverged_from(e, model, step, epoch) from e
                if not torch.isfinite(loss):
                    raise TrainingDiverged(f"loss became {loss.item()} at step {step} (epoch {epoch}); try a lower lr")
                optimizer_step(model, opt, loss, cfg.grad_clip)
                step += 1
                loss_value = loss.item()
            ctx.progress.update(bar, advance=1, description=f"train {ctx.mixer} loss {loss_value:.3f}")
            if step % ctx.log_every == 0 or step == total:
                ctx.log({"train/loss": loss_value, "train/lr": lr_at(step - 1, total, cfg, epoch)}, step)
        if graphed:
            loss_value = _read_loss(loss, step, epoch)
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
        if ctx.resume_dir is not None:
            save_state(ctx.resume_dir, model, opt, gen, total, SavedProgress(
                epoch=stats.epochs, step=step, loss=loss_value, train_time_s=trained_s(), eval_time_s=stats.eval_time_s,
                eval_curve=stats.eval_curve, stop_reason=stats.stop_reason, graph_steps=graph_steps()))
        if stats.stop_reason == "early_stop":
            break
    ctx.progress.remove_task(bar)
    stats.steps, stats.final_loss, stats.train_time_s = step, loss_value, trained_s()
    stats.graph_steps, stats.graphs = graph_steps(), len(runner.captured) if runner is not None else 0
    stats.compiled, stats.new_shapes = cfg.compile, list(runner.new_shapes) if runner is not None else []
    return stats


def step_details(stats: TrainStats) -> dict[str, object]:
    """How the training steps ran, for a record's details."""
    return {"mode": stats.step_mode, "steps": stats.steps, "graph_steps": stats.graph_steps, "graphs": stats.graphs,
            "steps_per_s": stats.steps / stats.train_time_s if stats.train_time_s > 0 else None,
            "resumed_at_epoch": stats.resumed_at_epoch, "compiled": stats.compiled,
            "new_shape_s": stats.new_shape_s if stats.step_mode == "cuda_graph" else None,
            "new_shapes": stats.new_shapes if stats.step_mode == "cuda_graph" else None}


def _read_loss(loss: torch.Tensor, step: int, epoch: int) -> float:
    """The loss as a float (a host sync); a NaN or an infinity is a divergence."""
    value = loss.item()
    if not math.isfinite(value):
        raise TrainingDiverged(
            f"loss became {value} by step {step} (epoch {epoch}; read every {LOSS_READ_EVERY} steps); try a lower lr")
    return value


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
