"""Memory: peak memory of forward+backward vs T (op and layer level, above the inputs), the
largest T that fits, and the decode-state bytes per sequence vs context length (softmax's
KV cache grows with T; a recurrent state does not). Softmax is measured alongside in the
same run, so every record carries its own comparison."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from tasks.base import RunContext, RunOutOfMemory, Task, TaskResult
from tasks.common.layer_config import LayerTaskConfig
from tasks.common.memprobe import MixerFwdBwd, MixerPrefillState, Probe, peak_memory
from tasks.common.plots import plot_memory, plot_state_bytes
from tasks.common.timing import cpu_threads
from tasks.common.workloads import (
    build_layer,
)
from tasks.registry import register_task

MiB = 2**20


class MemoryConfig(LayerTaskConfig):
    max_seq_len: int | None = Field(4096, ge=1, description="keep doubling T past the grid up to this, until out of memory")
    batch_size: int = Field(1, ge=1)
    modes: list[Literal["op", "layer"]] = Field(default_factory=lambda: ["op", "layer"])
    compare_softmax: bool = Field(True, description="measure softmax attention alongside")
    max_bytes: int | None = Field(
        None, ge=1, description="memory cap per call: a peak above it counts as out of memory (CPU: enforced)")
    point_timeout_s: float = Field(600.0, gt=0, description="CPU: a probe running longer fails and the sweep goes on")

    @model_validator(mode="after")
    def _extension(self):
        if self.max_seq_len is not None and self.max_seq_len < max(self.seq_lens):
            raise ValueError(
                f"max_seq_len={self.max_seq_len} is below the largest seq_len {max(self.seq_lens)}; raise it or set it to null")
        return self

    def lengths(self) -> list[int]:
        """The grid, then doublings of its largest T up to max_seq_len."""
        out = list(self.seq_lens)
        while self.max_seq_len is not None and out[-1] * 2 <= self.max_seq_len:
            out.append(out[-1] * 2)
        return out


@register_task("memory")
class Memory(Task):
    description = "peak fwd+bwd memory vs T, the largest T that fits, decode-state bytes vs context"
    Config = MemoryConfig
    primary_metric = "peak_mib"
    higher_is_better = False
    setting_fields = ("seq_lens", "max_seq_len", "batch_size", "num_heads", "head_dim", "d_model", "dtype", "max_bytes")
    board_device = "model"  # timings and peaks depend on the exact processor
    shown_metrics = ("max_T_fits", "op_peak_mib", "op_max_T_fits", "state_bytes", "peak_ratio_vs_softmax")
    presets = {
        # CPU: T = 64 .. 2048, capped at 64 MiB per call (softmax's O(T^2) layer backward
        # meets the cap inside the range); under a minute per mixer.
        "default": {"max_seq_len": 2048, "max_bytes": 64 * MiB},
        "tiny": {"seq_lens": [16, 32], "max_seq_len": None, "num_heads": 2, "head_dim": 16, "modes": ["layer"]},
        # One H200, one sequence at a time, B = 1, H = 16, K = V = 128, bf16.
        "gpu": {
            "seq_lens": [2**e for e in range(9, 17)], "max_seq_len": 262144, "batch_size": 1,
            "num_heads": 16, "head_dim": 128, "dtype": "bfloat16",
        },
    }

    def run(self, ctx: RunContext) -> TaskResult:
        cfg: MemoryConfig = ctx.config
        device = ctx.device
        spec, soft_spec = cfg.layer_spec(cfg.mixer), cfg.layer_spec(cfg.softmax)
        models = [(ctx.mixer, spec)]
        if cfg.compare_softmax and not (ctx.mixer == "softmax" and cfg.softmax == cfg.mixer):
            models.append(("softmax", soft_spec))
        probes = [Probe(mode, T) for mode in cfg.modes for T in cfg.lengths()]
        bar = ctx.progress.add_task(f"memory · {ctx.mixer}", total=len(models) + 1)
        points = []
        with cpu_threads(cfg.cpu_threads if device.type == "cpu" else None):
            for name, s in models:
                workload = MixerFwdBwd(name, s, cfg.batch_size, ctx.seed)
                for r in peak_memory(workload, probes, device, cfg.max_bytes, cfg.point_timeout_s, cfg.cpu_threads):
                    peak = r["peak_bytes"]
                    points.append({"model": name, "B": cfg.batch_size, **r, "peak_mib": peak / MiB if peak is not None else None})
                ctx.progress.advance(bar)
            mixer = build_layer(ctx.mixer, spec, device, ctx.seed)
            softmax = build_layer("softmax", soft_spec, device, ctx.seed)
            states = self._decode_states(cfg, ctx.mixer, mixer, softmax, spec, soft_spec, device, ctx.seed)
        ctx.progress.advance(bar)
        ctx.progress.remove_task(bar)

        _check_some_probe_ran(points, ctx.mixer, cfg)
        ctx.artifact_dir.mkdir(parents=True, exist_ok=True)
        artifacts = plot_memory(points, ctx.artifact_dir, ctx.mixer) + plot_state_bytes(states, ctx.artifact_dir, ctx.mixer)
        fits = {mode: _max_fit([p for p in points if p["model"] == ctx.mixer and p["mode"] == mode]) for mode in cfg.modes}
        details = {
            "points": points, "decode_state": states, "max_T_fits": fits,
            "shapes": {"num_heads": cfg.num_heads, "head_dim": cfg.head_dim, "d_model": cfg.width, "dtype": cfg.dtype,
                       "batch_size": cfg.batch_size},
            "what": "peak_bytes: peak memory of one forward+backward above the memory held once its inputs exist",
        }
        return TaskResult(metrics=_metrics(points, states, fits, ctx.mixer, cfg), backend=mixer.backend_used or "",
                          details=details, artifacts=artifacts)

    @staticmethod
    def _decode_states(cfg: MemoryConfig, name: str, mixer, softmax, spec, soft_spec, device, seed: int) -> list[dict]:
        """The decode-state stage as probes: on the CPU each prefill runs in a child process
        under the max_bytes cap and point_timeout_s, like the fwd+bwd probes; a length that
        runs out of memory skips the longer ones."""
        probes = [Probe("state", T) for T in cfg.lengths()]
        measured = {
            key: peak_memory(MixerPrefillState(layer, s, seed), probes, device, cfg.max_bytes, cfg.point_timeout_s,
                             cfg.cpu_threads)
            for key, layer, s in (("state_bytes", name, spec), ("softmax_state_bytes", "softmax", soft_spec))
        }
        return _state_rows(mixer, softmax, cfg.lengths(), measured)


def _check_some_probe_ran(points: list[dict], mixer: str, cfg: MemoryConfig) -> None:
    """A run whose every probe of the mixer under test failed measured nothing: not an ok record.
    Out of memory (or over max_bytes) everywhere it ran is RunOutOfMemory (status oom); else a
    RuntimeError naming the probes' errors."""
    mine = [p for p in points if p["model"] == mixer]
    if any(p["status"] == "ok" for p in mine):
        return
    statuses = sorted({p["status"] for p in mine})
    lengths = sorted({p["T"] for p in mine})
    where = f"T = {lengths[0]}..{lengths[-1]}" if lengths else "no lengths"
    if "oom" in statuses and set(statuses) <= {"oom", "skipped"}:  # lengths past an OOM are skipped
        cap = f"the max_bytes cap of {cfg.max_bytes:,} bytes" if cfg.max_bytes else "the device's memory"
        raise RunOutOfMemory(f"every probe of {mixer} ({len(mine)}, {where}) ran out of {cap}; "
                             f"raise max_bytes or lower the lengths")
    errors = sorted({str(p.get("error") or p["status"]).splitlines()[0] for p in mine})
    raise RuntimeError(f"no probe of {mixer} ran ({where}; statuses {statuses}): {'; '.join(errors[:3])}")


def _state_rows(mixer, softmax, lengths: list[int], measured: dict[str, list[dict]]) -> list[dict]:
    """Decode-state bytes per sequence after T tokens, from the prefill probes (the real cache a
    prefill of one sequence leaves), with each layer's state_size(T) floats beside them."""
    rows = []
    for i, T in enumerate(lengths):
        row: dict[str, Any] = {"T": T, "state_floats": mixer.state_size(T), "softmax_state_floats": softmax.state_size(T)}
        for key, results in measured.items():
            r = results[i]
            row[key] = r.get("value") if r["status"] == "ok" else None
            if r["status"] != "ok":
                row[f"{key}_error"] = f"{r['status']}: {r['error']}"
        rows.append(row)
    return rows


def _max_fit(series: list[dict]) -> dict:
    """The largest T measured ok with every smaller T ok too; and whether a limit was hit."""
    best, limited = None, False
    for p in sorted(series, key=lambda p: p["T"]):
        if p["status"] != "ok":
            limited = p["status"] in ("oom", "skipped")
            break
        best = p["T"]
    return {"T": best, "limit_reached": limited}


def _metrics(points, states, fits, mixer: str, cfg: MemoryConfig) -> dict[str, float]:
    out: dict[str, float] = {}
    largest = max(cfg.seq_lens)
    peaks = {(p["model"], p["mode"], p["T"]): p["peak_mib"] for p in points if p["status"] == "ok"}
    for (model, mode, T), mib in peaks.items():
        if model != mixer:
            continue
        prefix = "" if mode == "layer" else "op_"
        out[f"{prefix}peak_mib@{T}"] = mib
        if T == largest:
            out[f"{prefix}peak_mib"] = mib
            soft = peaks.get(("softmax", mode, T))
            if soft:
                out[f"{prefix}softmax_peak_mib"] = soft
                out[f"{prefix}peak_ratio_vs_softmax"] = mib / soft
    for mode, fit in fits.items():
        if fit["T"] is not None:
            out[f"{'' if mode == 'layer' else 'op_'}max_T_fits"] = float(fit["T"])
    for row in states:
        if row.get("state_bytes") is not None:
            out[f"state_bytes@{row['T']}"] = float(row["state_bytes"])
            if row["T"] == largest:
                out["state_bytes"] = float(row["state_bytes"])
    return out
