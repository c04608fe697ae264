"""Where an MQAR training step's GPU time goes: the zoology preset's model at one batch shape,
ms per step eager and replayed as a CUDA graph (steady state, after capture), and the
kernels with the most CUDA time in an eager step (torch.profiler).

    python -m benchmarks.mqar_step_profile --out results/findings/mqar_step_profile_h200.json \
        [--backends torch,triton] [--precisions highest,high] [--compile none,inductor]

--compile inductor wraps the model's loss in torch.compile (static shapes) before the eager
warm-up, so the graphed step replays Inductor's fused kernels; the record gives the first
call's compile seconds beside the step times.
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np
import torch

from benchmarks.json_record import save_record
from harness.config import resolve_config
from tasks.common.graphed_step import GraphedSteps, make_capturable_adamw
from tasks.common.model import MixerLM
from tasks.common.timing import TimingOptions, time_callable
from tasks.common.training import float32_matmul
from tasks.mqar import MQAR
from tasks.mqar_data import make_mqar


def cuda_ms_per_step(step, n: int) -> float:
    """Median GPU milliseconds of step() over n calls queued back to back: the tasks' one timer
    (tasks/common/timing.py) without its L2 flush, since a training step runs on its own traffic."""
    return time_callable(step, torch.device("cuda"), TimingOptions(warmup=0, min_repeats=n, max_repeats=n,
                                                                   flush_l2=False)).median_ms


def profile_mixer(mixer: str, backend: str, d_model: int, batch: int, seq_len: int, pairs: int, top: int,
                  compile_mode: str = "none") -> dict:
    cfg = resolve_config(MQAR, "zoology", None, [f"model.d_model={d_model}", f"model.mixer.backend={backend}"])
    x, y = make_mqar(batch, seq_len, pairs, cfg.vocab_size, 0, cfg.power_a, cfg.random_non_queries)
    tokens, labels = torch.from_numpy(x).long().cuda(), torch.from_numpy(y).long().cuda()
    scored = int((labels != -100).sum())
    torch.manual_seed(0)
    model = MixerLM(mixer, cfg.vocab_size, cfg.model, max_positions=seq_len).cuda()
    groups = [{"params": list(model.parameters()), "weight_decay": 0.1}]
    opt = make_capturable_adamw(groups, 1e-3, (0.9, 0.999), torch.device("cuda"))
    if compile_mode == "inductor":
        model.loss = torch.compile(model.loss, dynamic=False)
    steps = GraphedSteps(model, opt, None)

    def eager():
        steps._eager(tokens, labels, scored)

    t0 = time.perf_counter()
    eager()
    torch.cuda.synchronize()
    first_call_s = time.perf_counter() - t0
    for _ in range(2):
        eager()
    eager_ms = cuda_ms_per_step(eager, 10)
    steps.step(tokens, labels, scored)  # eager step + capture
    graph_ms = cuda_ms_per_step(lambda: steps.step(tokens, labels, scored), 30)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        eager()
        torch.cuda.synchronize()
    events = sorted(prof.key_averages(), key=lambda e: e.self_device_time_total, reverse=True)
    total_us = sum(e.self_device_time_total for e in events)
    kernels = [{"name": e.key[:120], "calls": e.count, "cuda_us": e.self_device_time_total} for e in events[:top]]
    return {"mixer": mixer, "backend": sorted(set(model.backends())),
            "compile": compile_mode, "first_call_s": first_call_s,
            "d_model": d_model, "batch": batch, "seq_len": seq_len, "kv_pairs": pairs,
            "eager_ms": eager_ms, "graph_ms": graph_ms, "eager_step_cuda_us": total_us,
            "kernel_launches": int(sum(e.count for e in events)), "top_kernels": kernels}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/findings/mqar_step_profile.json")
    parser.add_argument("--mixers", default="gdn,softmax,deltanet,mesa")
    parser.add_argument("--backends", default="torch", help="comma-separated: torch, triton (softmax always torch)")
    parser.add_argument("--precisions", default="highest",
                        help="comma-separated float32 matmul precisions: highest (fp32), high (TF32)")
    parser.add_argument("--compile", default="none", help="comma-separated: none, inductor (torch.compile the loss)")
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    record = {"what": __doc__.splitlines()[0], "device": torch.cuda.get_device_name(),
              "torch": torch.__version__, "python": platform.python_version(), "numpy": np.__version__,
              "shapes": "batch 256: T 256 with 64 pairs (the longest training setting) and T 64 with 4",
              "runs": []}
    for mixer in args.mixers.split(","):
        backends = ["torch"] if mixer == "softmax" else args.backends.split(",")
        for backend in backends:
            for precision, mode in [(p, c) for p in args.precisions.split(",") for c in args.compile.split(",")]:
                for seq_len, pairs in ((256, 64), (64, 4)):
                    with float32_matmul(precision):
                        r = profile_mixer(mixer, backend, args.d_model, 256, seq_len, pairs, args.top, mode)
                    record["runs"].append({**r, "matmul_precision": precision})
                    save_record(record, args.out)
                    print(f"{mixer} {backend} {precision} {mode} T={seq_len}: first call {r['first_call_s']:.1f} s, "
                          f"eager {r['eager_ms']:.2f} ms, "
                          f"graph {r['graph_ms']:.2f} ms, {r['kernel_launches']} launches, "
                          f"top {r['top_kernels'][0]['name'][:60]}", flush=True)


if __name__ == "__main__":
    main()
