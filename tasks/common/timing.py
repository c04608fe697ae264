"""Timing helpers for the efficiency tasks: medians after warm-up.

On CUDA each call is timed between two CUDA events, with the L2 cache flushed before it (so
a small recurrent state is not timed hot from the previous call). The timed calls are
enqueued back to back and the host waits once at the end (sync="end", as
triton.testing.do_bench and a training loop run them): an op's host work (argument checks,
Python-side launches) overlaps the GPU's and is counted only where it is the bottleneck.
sync="each" waits after every call instead, so that each call's host time before its first
kernel is counted as well. On the CPU each call is timed with time.perf_counter (CPU ops are
synchronous). The number of timed calls adapts to the cost of one call so that a point takes
about `target_ms` of measured time, between `min_repeats` and `max_repeats` calls. The tasks never import triton, so this
is our own do_bench-like loop rather than triton.testing.do_bench.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from tasks.common.faults import describe, free_memory, is_oom

# Larger than the L2 of current GPUs (H100/H200: 50-60 MB), so zeroing it evicts everything.
_L2_FLUSH_BYTES = 256 * 2**20
_flush_buffers: dict[torch.device, torch.Tensor] = {}


@dataclass(frozen=True)
class TimingOptions:
    """How hard to time one point.

    warmup: untimed calls first (Triton compiles and autotunes here); min_repeats /
    max_repeats: bounds on the timed calls; target_ms: measured time aimed at per point;
    flush_l2: zero a 256 MB buffer before each timed CUDA call; sync: on CUDA, wait once
    after all timed calls ("end") or after each ("each"; module doc)."""

    warmup: int = 3
    min_repeats: int = 5
    max_repeats: int = 100
    target_ms: float = 300.0
    flush_l2: bool = True
    sync: Literal["end", "each"] = "end"

    def __post_init__(self):
        if self.warmup < 0 or self.min_repeats < 1 or self.max_repeats < self.min_repeats or self.target_ms <= 0 \
                or self.sync not in ("end", "each"):
            raise ValueError(
                f"TimingOptions: need warmup >= 0, 1 <= min_repeats <= max_repeats, target_ms > 0, sync 'end' or "
                f"'each'; got {self}"
            )


class TimingConfig(BaseModel):
    """A task's `timing` option: medians after warm-up (see TimingOptions)."""

    model_config = ConfigDict(extra="forbid")

    warmup: int = Field(3, ge=0)
    min_repeats: int = Field(5, ge=1)
    max_repeats: int = Field(100, ge=1)
    target_ms: float = Field(300.0, gt=0, description="measured time aimed at per point")
    sync: Literal["end", "each"] = Field(
        "end", description="CUDA: wait once after the timed calls (host work overlaps the GPU's) or after each")

    def options(self) -> TimingOptions:
        """These settings as TimingOptions (max_repeats raised to min_repeats where below it)."""
        return TimingOptions(self.warmup, self.min_repeats, max(self.max_repeats, self.min_repeats), self.target_ms,
                             sync=self.sync)


@dataclass(frozen=True)
class Timing:
    """The result of timing one callable: median and spread of the timed calls, in ms."""

    median_ms: float
    p20_ms: float
    p80_ms: float
    repeats: int


def _quantile(sorted_ms: list[float], q: float) -> float:
    pos = q * (len(sorted_ms) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_ms) - 1)
    return sorted_ms[lo] + (pos - lo) * (sorted_ms[hi] - sorted_ms[lo])


def summarize(samples_ms: list[float]) -> Timing:
    """Median, 20th and 80th percentile of per-call times (ms)."""
    if not samples_ms:
        raise ValueError("summarize: samples_ms is empty; time at least one call")
    s = sorted(samples_ms)
    return Timing(statistics.median(s), _quantile(s, 0.2), _quantile(s, 0.8), len(s))


def _flush_l2(device: torch.device) -> None:
    buf = _flush_buffers.get(device)
    if buf is None:
        buf = _flush_buffers[device] = torch.empty(_L2_FLUSH_BYTES // 4, dtype=torch.int32, device=device)
    buf.zero_()


def _cuda_enqueue(fn: Callable[[], object], device: torch.device, flush: bool) -> tuple[torch.cuda.Event, ...]:
    """Enqueue one timed call (after an L2 flush when asked); its (start, end) events."""
    if flush:
        _flush_l2(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    return start, end


def _cuda_call_ms(fn: Callable[[], object], device: torch.device, flush: bool) -> float:
    start, end = _cuda_enqueue(fn, device, flush)
    end.synchronize()
    return start.elapsed_time(end)


def _cuda_queued_ms(fn: Callable[[], object], device: torch.device, flush: bool, count: int) -> list[float]:
    """`count` calls enqueued back to back, one wait at the end: each call's ms."""
    events = [_cuda_enqueue(fn, device, flush) for _ in range(count)]
    torch.cuda.synchronize(device)
    return [start.elapsed_time(end) for start, end in events]


def _cpu_call_ms(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def time_callable(fn: Callable[[], object], device: torch.device, options: TimingOptions = TimingOptions()) -> Timing:
    """Median time of fn() on `device` (CUDA events on a GPU, perf_counter on the CPU).

    fn takes no arguments; its result is dropped (so its memory is freed between calls).
    Exceptions (an out-of-memory too) propagate to the caller."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)

        def call() -> float:
            return _cuda_call_ms(fn, device, options.flush_l2)
    else:

        def call() -> float:
            return _cpu_call_ms(fn)

    warm = [call() for _ in range(options.warmup)]
    # The last warm-up call (past compilation) estimates the cost of one call.
    first = call() if not warm else warm[-1]
    samples = [] if warm else [first]
    estimate = max(first, 1e-3)
    repeats = int(min(options.max_repeats, max(options.min_repeats, options.target_ms // estimate)))
    if device.type == "cuda" and options.sync == "end":
        samples += _cuda_queued_ms(fn, device, options.flush_l2, repeats - len(samples))
    else:
        samples += [call() for _ in range(repeats - len(samples))]
    return summarize(samples)


@contextmanager
def cpu_threads(count: int | None) -> Iterator[None]:
    """Run the block with `count` torch intra-op threads (None: leave as is), then restore."""
    if count is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def measure(build: Callable[[], Callable[[], object]], device: torch.device, timing: TimingOptions,
            free: Callable[[torch.device], None] = free_memory) -> dict:
    """Time the call that build() returns: {"status": "ok", "ms", "p20_ms", "p80_ms", "repeats"}, or a
    failure or out-of-memory recorded as {"status": "failed" | "oom", "error"}, never raised; after
    a failure free(device) returns the freed memory."""
    try:
        t = time_callable(build(), device, timing)
        return {"status": "ok", "ms": t.median_ms, "p20_ms": t.p20_ms, "p80_ms": t.p80_ms, "repeats": t.repeats}
    except Exception as e:  # noqa: BLE001 - one point's fault must not end the sweep
        result = {"status": "oom" if is_oom(e) else "failed", "error": describe(e)}
    free(device)  # after the except block, so the traceback's tensors are gone
    return result
