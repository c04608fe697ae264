"""Throughput: op-level and layer-level forward, forward+backward and decode-step times of a
mixer over a range of T, at a fixed token budget (B·T constant) and at a fixed batch,
against softmax attention measured in the same process (so every record carries its own
baseline and crossover length), with softmax-backend and FLA columns where they run."""

from __future__ import annotations

from functools import partial
from typing import Literal

import torch
from pydantic import Field

from tasks.base import RunContext, Task, TaskResult
from tasks.common import flops as flop_counts
from tasks.common.baselines import (
    SOFTMAX_BACKENDS,
    fla_call,
    fla_kernel_name,
    fla_status,
    softmax_backend_status,
    softmax_baseline_call,
)
from tasks.common.crossover import crossover
from tasks.common.faults import free_memory
from tasks.common.layer_config import LayerTaskConfig
from tasks.common.plots import plot_decode, plot_times
from tasks.common.timing import TimingConfig, TimingOptions, cpu_threads, measure
from tasks.common.workloads import DTYPES, build_layer, make_call
from tasks.registry import register_task

SoftmaxBackend = Literal["flash_attn", "flash_attn_cute", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "sdpa_math"]
assert set(SoftmaxBackend.__args__) == set(SOFTMAX_BACKENDS)


class ThroughputConfig(LayerTaskConfig):
    token_budget: int = Field(4096, ge=1, description="B·T of the budget sweep (B = max(1, budget // T))")
    batch_size: int = Field(1, ge=1, description="B of the fixed-batch sweep")
    decode_batch_size: int | None = Field(None, ge=1, description="sequences decoded at once; default batch_size")
    sweeps: list[Literal["budget", "fixed_batch"]] = Field(default_factory=lambda: ["budget", "fixed_batch"])
    modes: list[Literal["op", "layer"]] = Field(default_factory=lambda: ["op", "layer"])
    phases: list[Literal["fwd", "fwdbwd", "decode"]] = Field(default_factory=lambda: ["fwd", "fwdbwd", "decode"])
    softmax_backends: list[SoftmaxBackend] = Field(
        default_factory=lambda: list(SOFTMAX_BACKENDS), description="extra op-level columns")
    compare: list[Literal["fla"]] = Field(default_factory=list, description="other libraries' kernels as extra op-level columns")
    baseline_sweeps: list[Literal["budget", "fixed_batch"]] = Field(
        default_factory=lambda: ["budget"], description="sweeps that get the extra columns")
    timing: TimingConfig = Field(default_factory=TimingConfig)


def _pow2(lo: int, hi: int) -> list[int]:
    return [2**e for e in range(lo, hi + 1)]


@register_task("throughput")
class Throughput(Task):
    description = "op/layer fwd, fwd+bwd and decode times vs T against softmax in the same process; crossover length"
    Config = ThroughputConfig
    primary_metric = "fwdbwd_tokens_per_s"
    higher_is_better = True
    setting_fields = ("seq_lens", "token_budget", "batch_size", "num_heads", "head_dim", "d_model", "dtype")
    board_device = "model"  # timings and peaks depend on the exact processor
    shown_metrics = ("fwd_tokens_per_s", "decode_tokens_per_s", "crossover_T_fwd", "crossover_T_fwdbwd", "op_fwdbwd_tflops")
    presets = {
        # CPU, about a minute per mixer on 2 busy cores.
        "default": {
            "token_budget": 2048,
            "timing": {"warmup": 1, "min_repeats": 3, "max_repeats": 20, "target_ms": 40.0},
        },
        # Seconds: tests and smoke runs.
        "tiny": {
            "seq_lens": [16, 32], "token_budget": 64, "num_heads": 2, "head_dim": 16,
            "softmax_backends": ["sdpa_math"],
            "timing": {"warmup": 1, "min_repeats": 2, "max_repeats": 3, "target_ms": 1.0},
        },
        # One H200: the anchors' shapes (B·T = 65,536, H = 16, K = V = 128, bf16).
        "gpu": {
            "seq_lens": _pow2(9, 16), "token_budget": 65536, "batch_size": 1, "decode_batch_size": 16,
            "num_heads": 16, "head_dim": 128, "dtype": "bfloat16",
            "timing": {"warmup": 3, "min_repeats": 5, "max_repeats": 30, "target_ms": 50.0},
        },
    }

    def run(self, ctx: RunContext) -> TaskResult:
        with cpu_threads(ctx.config.cpu_threads if ctx.device.type == "cpu" else None):
            return self._run(ctx)

    def _run(self, ctx: RunContext) -> TaskResult:
        cfg: ThroughputConfig = ctx.config
        device, dtype = ctx.device, DTYPES[cfg.dtype]
        d_model = cfg.width
        mixer = build_layer(ctx.mixer, cfg.layer_spec(cfg.mixer), device, ctx.seed)
        is_softmax = ctx.mixer == "softmax" and cfg.softmax == cfg.mixer
        softmax = mixer if is_softmax else build_layer("softmax", cfg.layer_spec(cfg.softmax), device, ctx.seed)
        t = cfg.timing
        timing = t.options()

        skipped = {n: softmax_backend_status(n, cfg.num_heads, cfg.head_dim, device, dtype) for n in cfg.softmax_backends}
        if "fla" in cfg.compare:
            skipped["fla"] = fla_status(device)
        columns = [n for n, why in skipped.items() if why is None]

        plan = self._plan(cfg)
        # softmax timings are shared by the mixers of one process (same shapes, options, timing)
        shared_key = (str(device), cfg.dtype, cfg.num_heads, cfg.head_dim, d_model, repr(sorted(cfg.softmax.items())), repr(t))
        bar = ctx.progress.add_task(f"throughput · {ctx.mixer}", total=len(plan))
        points = []
        for sweep, mode, phase, T, B in plan:
            point = {"mode": mode, "sweep": sweep, "phase": phase, "T": T, "B": B, "tokens": B * (1 if phase == "decode" else T)}
            point.update(_measure(partial(make_call, mixer, mode, phase, B, T), device, timing))
            if point["status"] == "ok":
                _rates(point, mixer, mode, phase, B, T)
            key = (*shared_key, "softmax", mode, phase, B, T)
            if is_softmax:
                base = point
                if point["status"] == "ok":
                    _SHARED.setdefault(key, {k: point[k] for k in ("status", "ms", "p20_ms", "p80_ms", "repeats")})
            else:
                base, point["softmax_reused"] = _shared(
                    key, lambda: _measure(partial(make_call, softmax, mode, phase, B, T), device, timing))
            point.update({"softmax_ms": base.get("ms"), "softmax_status": base["status"], "softmax_error": base.get("error")})
            point["speedup_vs_softmax"] = _ratio(base.get("ms"), point.get("ms"))
            if mode == "op" and phase != "decode" and sweep in cfg.baseline_sweeps:
                point["baselines"] = {
                    n: self._column(n, mixer, phase, B, T, cfg, device, dtype, timing, point, shared_key) for n in columns}
            points.append(point)
            ctx.progress.advance(bar)
        ctx.progress.remove_task(bar)

        crossovers = [] if is_softmax else _crossovers(points)
        artifacts = []
        ctx.artifact_dir.mkdir(parents=True, exist_ok=True)
        artifacts += plot_times(points, crossovers, ctx.artifact_dir, ctx.mixer)
        artifacts += plot_decode(points, crossovers, ctx.artifact_dir, ctx.mixer)
        details = {
            "points": points, "crossovers": crossovers,
            "decode_backend": mixer.decode_backend(device, dtype),
            "baselines": {"softmax": f"softmax mixer, op backend {softmax.backend_used}",
                          **{n: (why or "ok") for n, why in skipped.items()}},
            "shapes": {"num_heads": cfg.num_heads, "head_dim": cfg.head_dim, "d_model": d_model, "dtype": cfg.dtype},
            "flop_convention": flop_counts.__doc__,
            "speedup": "speedup_vs_X = X time / mixer time (> 1: the mixer is faster)",
            "softmax_reuse": "softmax figures are measured once per process and shared by the mixers run in it "
                             "(softmax_reused / reused: True where this record took them from an earlier mixer)",
        }
        metrics = _metrics(points, crossovers, cfg)
        return TaskResult(metrics=metrics, backend=mixer.backend_used or "", details=details, artifacts=artifacts)

    @staticmethod
    def _plan(cfg: ThroughputConfig) -> list[tuple[str, str, str, int, int]]:
        """(sweep, mode, phase, T, B) of every point, smallest work first within a series."""
        plan = []
        for mode in cfg.modes:
            for sweep in cfg.sweeps:
                for phase in (p for p in cfg.phases if p != "decode"):
                    for T in cfg.seq_lens:
                        B = max(1, cfg.token_budget // T) if sweep == "budget" else cfg.batch_size
                        plan.append((sweep, mode, phase, T, B))
            if "decode" in cfg.phases:
                plan += [("decode", mode, "decode", T, cfg.decode_batch_size or cfg.batch_size) for T in cfg.seq_lens]
        return plan

    @staticmethod
    def _column(name, mixer, phase, B, T, cfg, device, dtype, timing, point, shared_key) -> dict:
        if name == "fla":
            kernel = fla_kernel_name(mixer)
            if kernel is None:
                return {"status": "skipped", "error": f"fla has no kernel for op {mixer.op_name}"}
            col = {"kernel": kernel, **_measure(partial(fla_call, mixer, phase, B, T), device, timing)}
        else:
            build = partial(softmax_baseline_call, name, phase, B, T, cfg.num_heads, cfg.head_dim, device, dtype)
            measured, reused = _shared((*shared_key, name, phase, B, T), lambda: _measure(build, device, timing))
            col = {**measured, "reused": reused}
        col["speedup"] = _ratio(col.get("ms"), point.get("ms"))
        return col


# Softmax measurements of this process, by shapes, options and timing: a multi-mixer run
# (`--mixer a,b,c`) times each softmax point once and every record carries the same figures.
_SHARED: dict[tuple, dict] = {}


def _shared(key: tuple, measure) -> tuple[dict, bool]:
    """(measurement, reused): the stored one for key, or measure() now (kept when it succeeded)."""
    if key in _SHARED:
        return _SHARED[key], True
    result = measure()
    if result["status"] == "ok":
        _SHARED[key] = result
    return result, False


def _measure(build, device: torch.device, timing: TimingOptions) -> dict:
    """Time the call that build() returns; a failure or out-of-memory is recorded, not raised."""
    return measure(build, device, timing, free=free_memory)


def _rates(point: dict, mixer, mode: str, phase: str, B: int, T: int) -> None:
    seconds = point["ms"] / 1e3
    point["tokens_per_s"] = point["tokens"] / seconds
    try:
        point["flops"] = flop_counts.mixer_flops(mixer, mode, phase, B, T)
        point["tflops"] = point["flops"] / seconds / 1e12
    except ValueError:  # an op without a count (a third-party mixer)
        point["flops"] = point["tflops"] = None


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


def _crossovers(points: list[dict]) -> list[dict]:
    series: dict[tuple, list] = {}
    for p in points:
        series.setdefault((p["mode"], p["sweep"], p["phase"]), []).append((p["T"], p.get("ms"), p.get("softmax_ms")))
    return [{"mode": m, "sweep": s, "phase": ph, **crossover(v).as_dict()} for (m, s, ph), v in series.items()]


def _metrics(points: list[dict], crossovers: list[dict], cfg: ThroughputConfig) -> dict[str, float]:
    """Flat metrics: layer level unprefixed, op level prefixed 'op_'; per-T times of the
    budget sweep and decode; rates at the largest T; crossover lengths."""
    out: dict[str, float] = {}
    largest = max(cfg.seq_lens)
    for p in points:
        prefix = "" if p["mode"] == "layer" else "op_"
        if p["status"] != "ok" or p["sweep"] == "fixed_batch":
            continue
        out[f"{prefix}{p['phase']}_ms@{p['T']}"] = p["ms"]
        if p["T"] == largest:
            out[f"{prefix}{p['phase']}_tokens_per_s"] = p["tokens_per_s"]
            if p.get("tflops") is not None:
                out[f"{prefix}{p['phase']}_tflops"] = p["tflops"]
            if p.get("speedup_vs_softmax") is not None:
                out[f"{prefix}{p['phase']}_speedup_vs_softmax"] = p["speedup_vs_softmax"]
    for c in crossovers:
        if c["T"] is not None:
            prefix = "" if c["mode"] == "layer" else "op_"
            suffix = "_fixedB" if c["sweep"] == "fixed_batch" else ""
            out[f"{prefix}crossover_T_{c['phase']}{suffix}"] = c["T"]
    out["points_failed"] = float(sum(p["status"] != "ok" for p in points))
    return out
