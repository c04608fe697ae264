"""Training steps replayed as CUDA graphs.

A recall model is small: an eager step is hundreds of kernel launches that each do a few
microseconds of work, so the GPU waits on Python. Here forward, backward, gradient clipping
and AdamW are captured once per batch shape as one CUDA graph and then replayed, one launch a
step. The first batch of every shape runs eagerly (it warms up autograd, cuBLAS and the
optimiser state) and is a real training step; capture itself runs nothing.

The graphs share one memory pool and are replayed one at a time, which is safe: each holds
nothing between replays but its static inputs and loss (parameters, gradients' owners and the
optimiser state live outside the pool).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from tasks.common.model import MixerLM

MAX_GRAPHS = 32  # batch shapes captured per run; further shapes run eagerly (and are counted)


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    tokens: torch.Tensor  # static input [B, T]
    labels: torch.Tensor  # static input [B, T]
    loss: torch.Tensor  # static output, scalar


def new_shapes_seconds(new_shapes: list[dict[str, float]]) -> float:
    """Seconds that GraphedSteps.new_shapes' entries took: each first step and its capture."""
    return sum(s["first_step_s"] + s["capture_s"] for s in new_shapes)


class GraphedSteps:
    """One training step per call: a replayed CUDA graph, or an eager step for a new shape.

    The optimiser must be built with capturable=True and tensor learning rates on the device
    (make_capturable_adamw). loss_fn(tokens, labels, scored) -> (loss, predictions, targets)
    defaults to model.loss; a torch.compile'd one is compiled by the eager first step of each
    shape, so capture records Inductor's kernels."""

    def __init__(self, model: MixerLM, opt: torch.optim.Optimizer, grad_clip: float | None,
                 loss_fn: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None):
        self.model, self.opt, self.grad_clip = model, opt, grad_clip
        self.loss_fn = loss_fn if loss_fn is not None else model.loss
        self.pool = torch.cuda.graph_pool_handle()
        self.captured: dict[tuple[int, int, int], _Captured] = {}
        self.side = torch.cuda.Stream()
        self.graph_steps = 0
        # Per new shape: {batch, seq_len, scored, first_step_s (eager: the compile, or a cache
        # load), capture_s}, in the order met.
        self.new_shapes: list[dict[str, float]] = []

    @property
    def new_shape_s(self) -> float:
        """Wall time of the first step of each shape so far: compile and capture."""
        return new_shapes_seconds(self.new_shapes)

    def step(self, tokens: torch.Tensor, labels: torch.Tensor, scored: int) -> torch.Tensor:
        """Train on tokens, labels [B, T] (on the GPU) with `scored` labelled positions.

        Returns the loss as a device scalar (no host sync); a graph's loss tensor is reused by
        its next replay, so read it before the next step."""
        key = (tokens.shape[0], tokens.shape[1], scored)
        hit = self.captured.get(key)
        if hit is not None:
            hit.tokens.copy_(tokens)
            hit.labels.copy_(labels)
            hit.graph.replay()
            self.graph_steps += 1
            return hit.loss
        # The first batch of a new shape: a real step, eager, on a side stream as capture wants.
        # Timed to the GPU's end (a few syncs a run) so a record can say what warm-up costs.
        torch.cuda.synchronize()
        start = time.perf_counter()
        self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side):
            loss = self._eager(tokens, labels, scored)
        torch.cuda.current_stream().wait_stream(self.side)
        torch.cuda.synchronize()
        eager_done = time.perf_counter()
        if len(self.captured) < MAX_GRAPHS:
            self.captured[key] = self._capture(tokens, labels, scored)
        torch.cuda.synchronize()
        end = time.perf_counter()
        self.new_shapes.append({"batch": key[0], "seq_len": key[1], "scored": key[2],
                                "first_step_s": eager_done - start, "capture_s": end - eager_done})
        return loss

    def _eager(self, tokens: torch.Tensor, labels: torch.Tensor, scored: int) -> torch.Tensor:
        loss, _, _ = self.loss_fn(tokens, labels, scored)
        optimizer_step(self.model, self.opt, loss, self.grad_clip)
        return loss.detach()

    def _capture(self, tokens: torch.Tensor, labels: torch.Tensor, scored: int) -> _Captured:
        static_tokens, static_labels = tokens.clone(), labels.clone()
        graph = torch.cuda.CUDAGraph()
        # Gradients set to None, so the captured backward allocates (and on replay rewrites)
        # its own instead of accumulating into the eager step's.
        self.opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph, pool=self.pool):
            loss = self._eager(static_tokens, static_labels, scored)
        return _Captured(graph, static_tokens, static_labels, loss)


def optimizer_step(model: MixerLM, opt: torch.optim.Optimizer, loss: torch.Tensor, grad_clip: float | None) -> None:
    """Backward from `loss` into fresh gradients, clip them (unless grad_clip is None), step."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if grad_clip is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    opt.step()


def make_capturable_adamw(groups: list[dict], lr: float, betas: tuple[float, float],
                          device: torch.device) -> torch.optim.AdamW:
    """AdamW whose step can be captured: state and learning rate live on the device."""
    for group in groups:
        group["lr"] = torch.tensor(lr, dtype=torch.float32, device=device)
    return torch.optim.AdamW(groups, lr=torch.tensor(lr, device=device), betas=betas, capturable=True, foreach=True)


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    """Set every group's learning rate, in place when it is a device tensor (no sync)."""
    for group in opt.param_groups:
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr
