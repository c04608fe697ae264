"""Where one call's time goes: the kernels (CUDA) or operators (CPU) a call launches, under
torch.profiler, with each one's time per call. A breakdown beside the timer's medians
(tasks/common/timing.py), not a second timer: the profiler adds its own overhead, so its
totals are read as shares, and the task's times stay those of the timer."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile


def kernel_breakdown(fn: Callable[[], object], device: torch.device, calls: int = 3, top: int = 12) -> list[dict]:
    """The `top` kernels (CUDA) or self-time operators (CPU) of fn() by time, each as
    {"name", "us_per_call", "launches_per_call"}, averaged over `calls` calls after one
    untimed call. Names are the profiler's (a Triton kernel's is its function name)."""
    if calls < 1 or top < 1:
        raise ValueError(f"kernel_breakdown: need calls >= 1 and top >= 1, got calls={calls}, top={top}")
    on_cuda = device.type == "cuda"
    fn()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    if on_cuda:
        torch.cuda.synchronize(device)
    with profile(activities=activities) as prof:
        for _ in range(calls):
            fn()
        if on_cuda:
            torch.cuda.synchronize(device)
    rows = []
    for event in prof.key_averages():
        if on_cuda:
            if event.device_type != DeviceType.CUDA:
                continue
            us = event.self_device_time_total
        else:
            us = event.self_cpu_time_total
        if us > 0:
            rows.append({"name": event.key, "us_per_call": us / calls, "launches_per_call": event.count / calls})
    rows.sort(key=lambda r: -r["us_per_call"])
    return rows[:top]
