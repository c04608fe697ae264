"""The CUDA timer's two waits on a GPU (tasks/common/timing.py): with sync="end" an op's host
work overlaps the GPU's and is not counted where the GPU is the bottleneck; with sync="each"
it is. Skipped without CUDA."""

from __future__ import annotations

import time

import torch

from tasks.common.timing import TimingOptions, time_callable
from tests.util import GPU_ONLY

pytestmark = GPU_ONLY

HOST_MS = 2.0


def gpu_bound_call_with_host_work():
    """A call that spends HOST_MS on the host before launching several ms of GPU work."""
    a = torch.randn(4096, 4096, device="cuda")

    def call():
        time.sleep(HOST_MS / 1e3)
        for _ in range(8):
            a @ a

    return call, a


def test_host_time_is_hidden_behind_the_gpu_only_when_the_calls_are_queued():
    call, a = gpu_bound_call_with_host_work()
    queued = time_callable(call, torch.device("cuda"), TimingOptions(warmup=3, min_repeats=20, max_repeats=20))
    each = time_callable(call, torch.device("cuda"), TimingOptions(warmup=3, min_repeats=20, max_repeats=20,
                                                                   sync="each"))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(8):
        a @ a
    end.record()
    end.synchronize()
    gpu_ms = start.elapsed_time(end)
    assert gpu_ms > 2 * HOST_MS, f"the GPU work ({gpu_ms:.2f} ms) must outlast the host work to test this"
    # sync="each": the GPU idles while the host sleeps, so about HOST_MS more than the GPU work.
    assert each.median_ms > gpu_ms + 0.5 * HOST_MS, (each, gpu_ms)
    # sync="end": the host sleeps while the GPU runs the previous call's work.
    assert queued.median_ms < gpu_ms + 0.25 * HOST_MS, (queued, gpu_ms)
