"""Kernels: the op behind a mixer timed on its own, forward and forward+backward, on each of its
backends that runs on the device (torch; triton on CUDA or under TRITON_INTERPRET=1) and, where
installed and on CUDA, FLA's equivalent kernel, all through one timer (tasks/common/timing.py:
CUDA events with the L2 flushed, medians).

The mixer names the op (its `op_name`, whose OpSpec in kernels/registry.py gives the backends,
the random inputs, the FLOP counts and FLA's kernel); the mixer's options give the op's own
options (chunk_size, cg_steps, ...) and the input variant (GLA's gate kind). Every point records
the backend that ran it; the record's backend is the one "auto" picks here, whose times are
the record's metrics.

`launch` changes the Triton kernels' launch settings for the run (op -> field changes, as
kernels.common.launch.with_changes takes them), so a sweep's `vary` times variants:

    vary: {launch.gated_delta_rule.wy_fwd.BK: [32, 64, 128]}

The record's `launch` field holds the settings every Triton op of the run ran with.
"""

from __future__ import annotations

import inspect
from functools import partial
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from kernels.common.dispatch import ALL_BACKENDS
from kernels.common.launch import DEFAULTS as LAUNCH_DEFAULTS
from kernels.common.launch import launch_settings, with_changes
from kernels.common.spec import OpSpec, io_bytes, load_entry
from kernels.registry import SPECS
from mixers import build_mixer, get_mixer, mixer_names
from tasks.base import RunContext, Task, TaskConfig, TaskResult
from tasks.common import flops as flop_counts
from tasks.common.baselines import fla_status
from tasks.common.kernel_profile import kernel_breakdown
from tasks.common.layer_config import length_grid
from tasks.common.timing import TimingConfig, cpu_threads, measure
from tasks.common.workloads import DTYPES, op_inputs, phase_call
from tasks.registry import register_task


class HeadShape(BaseModel):
    """Heads of one shape: H heads of K = V = head_dim."""

    model_config = ConfigDict(extra="forbid")

    num_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)


class KernelsConfig(TaskConfig):
    seq_lens: list[int] = Field(default_factory=lambda: [256, 1024], description="T grid")
    token_budget: int = Field(4096, ge=1, description="B·T of every point (B = max(1, budget // T))")
    heads: list[HeadShape] = Field(default_factory=lambda: [HeadShape(num_heads=2, head_dim=32)])
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    phases: list[Literal["fwd", "fwdbwd"]] = Field(default_factory=lambda: ["fwd", "fwdbwd"])
    backends: list[str] | None = Field(
        None, description="the op's backends to time; default every one but the per-token reference")
    compare: list[Literal["fla"]] = Field(default_factory=lambda: ["fla"], description="other libraries' kernels")
    mixer: dict[str, Any] = Field(default_factory=dict, description="options of the mixer whose op is timed")
    launch: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="launch-setting changes per op, e.g. {gated_delta_rule: {wy_fwd: {BK: 32}}} (kernels/common/launch/)")
    timing: TimingConfig = Field(default_factory=TimingConfig)
    profile: int = Field(0, ge=0, description="record each point's top N kernels (CUDA) or operators (CPU) "
                         "by time per call, under torch.profiler after the timing (tasks/common/kernel_profile.py); "
                         "0: off")
    cpu_threads: int | None = Field(1, ge=1, description="torch intra-op threads on the CPU during the run")

    @field_validator("seq_lens")
    @classmethod
    def _grid(cls, v: list[int]) -> list[int]:
        return length_grid(v)

    @field_validator("heads")
    @classmethod
    def _some_heads(cls, v: list[HeadShape]) -> list[HeadShape]:
        if not v:
            raise ValueError("heads must name at least one {num_heads, head_dim}")
        return v

    @field_validator("backends")
    @classmethod
    def _known_backends(cls, v: list[str] | None) -> list[str] | None:
        unknown = [b for b in v or [] if b not in ALL_BACKENDS]
        if unknown:
            raise ValueError(f"unknown backends {unknown}; valid: {', '.join(ALL_BACKENDS)}")
        return v

    @field_validator("launch")
    @classmethod
    def _launch_changes(cls, v: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        # Applied to the defaults here so that a bad name or value fails the config, not the run.
        for op, changes in v.items():
            if op not in LAUNCH_DEFAULTS:
                raise ValueError(f"no launch settings for op {op!r}; ops with Triton kernels: {sorted(LAUNCH_DEFAULTS)}")
            with_changes(LAUNCH_DEFAULTS[op], changes, op)
        return v

    @field_validator("mixer")
    @classmethod
    def _sizes_are_task_fields(cls, v: dict[str, Any]) -> dict[str, Any]:
        clash = sorted({"num_heads", "head_dim"} & set(v))
        if clash:
            raise ValueError(f"{clash} are set by `heads` here, not inside mixer")
        return v


def _mixers_with_an_op() -> list[str]:
    return [name for name in mixer_names() if get_mixer(name).op_name in SPECS]


@register_task("kernels")
class Kernels(Task):
    description = "the mixer's op alone: fwd and fwd+bwd times of each backend here, beside FLA's kernel"
    Config = KernelsConfig
    primary_metric = "fwdbwd_tflops"
    higher_is_better = True
    setting_fields = ("seq_lens", "token_budget", "heads", "dtype")
    shown_metrics = ("fwd_tflops", "fwdbwd_ms", "fwd_ms")
    board_device = "model"  # timings depend on the exact processor
    presets = {
        # CPU, a minute or so per mixer.
        "default": {"timing": {"warmup": 1, "min_repeats": 3, "max_repeats": 20, "target_ms": 40.0}},
        # Seconds: tests and smoke runs.
        "tiny": {
            "seq_lens": [16, 32], "token_budget": 64, "heads": [{"num_heads": 2, "head_dim": 16}],
            "timing": {"warmup": 1, "min_repeats": 2, "max_repeats": 3, "target_ms": 1.0},
        },
        # One H200: B·T = 65,536 at T 2k, 8k and 32k, 16 heads of 128 and 32 of 64, bf16.
        "gpu": {
            "seq_lens": [2048, 8192, 32768], "token_budget": 65536, "dtype": "bfloat16",
            "heads": [{"num_heads": 16, "head_dim": 128}, {"num_heads": 32, "head_dim": 64}],
            "timing": {"warmup": 3, "min_repeats": 5, "max_repeats": 30, "target_ms": 50.0},
        },
    }

    @classmethod
    def check_mixer(cls, mixer: str) -> None:
        valid = _mixers_with_an_op()
        if mixer not in valid:
            raise ValueError(f"task kernels times the op of a mixer; {mixer!r} has no registered op "
                             f"(kernels.registry); valid mixers: {', '.join(valid)}")

    def run(self, ctx: RunContext) -> TaskResult:
        cfg: KernelsConfig = ctx.config
        with cpu_threads(cfg.cpu_threads if ctx.device.type == "cpu" else None), launch_settings(**cfg.launch):
            return self._run(ctx)

    def _run(self, ctx: RunContext) -> TaskResult:
        cfg: KernelsConfig = ctx.config
        device, dtype = ctx.device, DTYPES[cfg.dtype]
        spec, variant, options = op_of_mixer(ctx.mixer, cfg.mixer, cfg.heads[0])
        backends, skipped = _backends_here(spec, cfg.backends, device, dtype)
        fla = spec.fla_kernel(variant) if "fla" in cfg.compare else None
        if "fla" in cfg.compare:
            skipped["fla"] = fla_status(device) or (None if fla else f"fla has no kernel for {spec.name}")
        columns = backends + (["fla"] if "fla" in cfg.compare and skipped["fla"] is None else [])
        auto = spec.resolve("auto", device, dtype)
        primary = auto if auto in backends else (backends[0] if backends else None)

        plan = [(h, T, phase) for h in cfg.heads for T in cfg.seq_lens for phase in cfg.phases]
        bar = ctx.progress.add_task(f"kernels · {ctx.mixer}", total=len(plan) * max(1, len(columns)))
        timing, points = cfg.timing.options(), []
        for h, T, phase in plan:
            B = max(1, cfg.token_budget // T)
            shape = {"B": B, "T": T, "H": h.num_heads, "K": h.head_dim, "V": h.head_dim}
            # One set of inputs per point, shared by its columns (gradients are returned, not accumulated).
            args = spec.make_inputs(B, T, h.num_heads, h.head_dim, h.head_dim, variant=variant, dtype=dtype,
                                    device=device, seed=ctx.seed)
            for t in args.values():
                t.requires_grad_(phase == "fwdbwd")
            moved = io_bytes(args) + args["v"].numel() * args["v"].element_size()  # the inputs and o
            for column in columns:
                point = {"op": spec.name, "variant": variant, "backend": column, "phase": phase, **shape}
                if column == "fla":
                    point["kernel"] = fla.name
                build = partial(_call, spec, column, fla, options, phase, args)
                point.update(measure(build, device, timing))
                if point["status"] == "ok":
                    _rates(point, spec, options, moved)
                    if cfg.profile:
                        point["kernels"] = kernel_breakdown(build(), device, top=cfg.profile)
                points.append(point)
                ctx.progress.advance(bar)
            del args
        ctx.progress.remove_task(bar)

        details = {
            "op": spec.name, "variant": variant, "op_options": options, "points": points,
            "backends": {n: (why or "ok") for n, why in {**{b: None for b in backends}, **skipped}.items()},
            "auto_backend": auto, "flop_convention": flop_counts.__doc__,
            "bytes": "bytes of the op's arguments and outputs (each read or written once): the least traffic",
        }
        return TaskResult(metrics=_metrics(points, primary, cfg), backend=primary or "", details=details)


def op_of_mixer(mixer: str, mixer_options: dict[str, Any], heads: HeadShape) -> tuple[OpSpec, str, dict[str, Any]]:
    """(spec, input variant, op options) of the op that mixer `mixer` with these options runs.

    The op options are the mixer's config fields that the op's public function takes (e.g.
    chunk_size, cg_steps); the variant is read off the gates of a one-token probe of the mixer."""
    layer = build_mixer(mixer, heads.num_heads * heads.head_dim,
                        {"num_heads": heads.num_heads, "head_dim": heads.head_dim, **mixer_options})
    spec = SPECS[layer.op_name]
    taken = inspect.signature(load_entry(spec.function)).parameters
    options = {name: getattr(layer.config, name) for name in taken
               if name in type(layer.config).model_fields and name != "backend"}
    probe = op_inputs(layer, 1, 1)
    variant = spec.variant_of({"q": probe.q, "k": probe.k, "v": probe.v, **probe.gates})
    return spec, variant, options


def _backends_here(spec: OpSpec, wanted: list[str] | None, device: torch.device,
                   dtype: torch.dtype) -> tuple[list[str], dict[str, str | None]]:
    """The backends to time that run here, and why each other one does not."""
    names = list(wanted) if wanted is not None else [b for b in spec.backend_names if b != "reference"]
    unknown = [b for b in names if b not in spec.backends]
    if unknown:
        raise ValueError(f"kernels: backends {unknown} are not backends of {spec.name}; valid: {list(spec.backends)}")
    runs, skipped = [], {}
    for name in names:
        try:
            spec.resolve(name, device, dtype)
            runs.append(name)
        except ValueError as e:
            skipped[name] = str(e)
    return runs, skipped


def _call(spec: OpSpec, column: str, fla, options: dict[str, Any], phase: str, args: dict[str, torch.Tensor]):
    """A zero-argument call of one point: the op on `column` (a backend, or "fla") on `args`."""
    wrt = [t for t in args.values() if t.requires_grad]
    if column == "fla":
        kernel = load_entry(fla.entry)
        return phase_call(lambda: fla.call(kernel, {**args, **options}), wrt, phase, args["v"])
    fn = load_entry(spec.function)
    # Valid by construction (the input factory): no value checks, which would sync every call.
    check = {"check_values": False} if "check_values" in inspect.signature(fn).parameters else {}
    return phase_call(lambda: fn(**args, **options, **check, backend=column)[0], wrt, phase, args["v"])


def _rates(point: dict, spec: OpSpec, options: dict[str, Any], moved: float) -> None:
    seconds = point["ms"] / 1e3
    B, T, H, K, V = (point[n] for n in ("B", "T", "H", "K", "V"))
    point["tokens_per_s"] = B * T / seconds
    point["flops"] = spec.counts.flops(point["phase"], B, T, H, K, V, **options)
    point["tflops"] = point["flops"] / seconds / 1e12
    point["bytes"] = moved
    point["gb_per_s"] = moved / seconds / 1e9


def _metrics(points: list[dict], primary: str | None, cfg: KernelsConfig) -> dict[str, float]:
    """Per point `<backend>_<phase>_ms@T<T>_H<H>_K<K>`; the primary backend's `<phase>_ms` and
    `<phase>_tflops` at the largest T of the first head shape; `<backend>_<phase>_speedup_vs_fla`
    there; points_failed."""
    out: dict[str, float] = {}
    first, largest = cfg.heads[0], max(cfg.seq_lens)
    at_top = {}
    for p in points:
        if p["status"] != "ok":
            continue
        out[f"{p['backend']}_{p['phase']}_ms@T{p['T']}_H{p['H']}_K{p['K']}"] = p["ms"]
        if p["T"] == largest and (p["H"], p["K"]) == (first.num_heads, first.head_dim):
            at_top[(p["backend"], p["phase"])] = p
    for (backend, phase), p in at_top.items():
        if backend == primary:
            out[f"{phase}_ms"], out[f"{phase}_tflops"] = p["ms"], p["tflops"]
        fla = at_top.get(("fla", phase))
        if backend != "fla" and fla is not None:
            out[f"{backend}_{phase}_speedup_vs_fla"] = fla["ms"] / p["ms"]
    out["points_failed"] = float(sum(p["status"] != "ok" for p in points))
    return out
