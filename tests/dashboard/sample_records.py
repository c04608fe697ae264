"""Hand-made run records for the dashboard tests (and the README screenshot): every task,
several mixers, two devices, a d_model x lr sweep, and a nightly history of six runs in
which the last gdn throughput run drops by a quarter (the one regression).

The numbers are modelled, not measured: shaped after the H200 reference figures in
shared/anchors (B·T = 65,536, H = 16, K = V = 128, bf16) and small CPU runs, so the
figures look like real ones. The records go through RunRecord and write_record, exactly
as the harness writes them; configs are the tasks' resolved presets."""

from __future__ import annotations

import math
import random
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from harness.config import config_hash
from harness.records import RunRecord, write_record
from tasks.common.crossover import crossover
from tasks.registry import get_task

H200, CPU = "NVIDIA H200", "cpu: AMD EPYC 7B13"
GPU_VERSIONS = {"python": "3.12.3", "torch": "2.11.0+cu130", "triton": "3.6.0", "cuda": "13.0", "harness": "0.1.0",
                "flash_attn": None, "fla": None}
CPU_VERSIONS = {"python": "3.11.7", "torch": "2.13.0+cpu", "triton": "3.9.0", "cuda": None, "harness": "0.1.0",
                "flash_attn": None, "fla": None}
COMMITS = ["67669e7a1c0d4b2f9e8a7b6c5d4e3f2a1b0c9d8e", "9f1e2d3c4b5a69788796a5b4c3d2e1f0a9b8c7d6"]
START = datetime(2026, 11, 20, 2, 0, tzinfo=timezone.utc)
# op fwd / fwd+bwd ms at B·T = 65,536 on the H200 (anchors; gdn, lin_gdn estimated)
OP_MS = {"linear": (0.73, 3.75), "gla": (2.60, 12.7), "deltanet": (1.97, 6.15), "gdn": (2.10, 7.0),
         "lin_gdn": (2.40, 7.6), "mesa": (14.5, 44.2)}
RECURRENT_MIXERS = list(OP_MS)


class Writer:
    """Writes records with increasing timestamps; remembers nothing else."""

    def __init__(self, results: Path):
        self.results, self.n = Path(results), 0

    def write(self, task: str, mixer: str, preset: str, device: str, metrics: dict[str, float], *,
              details: dict | None = None, set_: dict[str, Any] | None = None, when: datetime | None = None,
              seed: int = 0, status: str = "ok", error: str | None = None, backend: str = "triton") -> RunRecord:
        cls = get_task(task)
        config = cls.Config(**_merge(cls.presets[preset], set_ or {})).model_dump(mode="json")
        chash = config_hash(mixer, task, config, seed)
        self.n += 1
        finished = when or START + timedelta(minutes=7 * self.n)
        started = finished - timedelta(seconds=95)
        run_id = f"{finished:%Y%m%dT%H%M%S}-{task}-{mixer}-{chash[:8]}-{self.n:04x}"
        gpu = device == H200
        rec = RunRecord(
            run_id=run_id, config_hash=chash, mixer=mixer, task=task, preset=preset, config=config,
            metrics=metrics if status == "ok" else {}, details=details or {}, backend=backend if status == "ok" else None,
            device=device, versions=GPU_VERSIONS if gpu else CPU_VERSIONS,
            git_commit=COMMITS[finished > START + timedelta(days=4)],
            seed=seed, started=started.isoformat(timespec="seconds"), finished=finished.isoformat(timespec="seconds"),
            duration_s=95.0, status=status, error=error,
        )
        write_record(self.results, rec)
        return rec


def _merge(base: dict, overrides: dict) -> dict:
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
    for dotted, value in overrides.items():
        node = out
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


# ---- throughput -----------------------------------------------------------------------------

def _speed_ms(mixer: str, mode: str, phase: str, T: int, B: int, gpu: bool, slow: float) -> float:
    """Modelled time of one call: softmax quadratic in T, the rest linear in tokens."""
    tokens = B * T
    if phase == "decode":  # softmax reads its KV cache; a recurrent state is fixed-size
        if gpu:
            ms = (0.05 + B * T * 6.0e-7) if mixer == "softmax" else 0.06 + 0.02 * (mixer == "mesa")
            return (ms + (0.09 if mode == "layer" else 0)) * slow
        ms = (0.9 + B * T * 4.0e-3) if mixer == "softmax" else 2.2 + 0.8 * (mixer == "mesa")
        return (ms + (1.5 if mode == "layer" else 0)) * slow
    if mixer == "softmax":
        ms = tokens * T * 8.0e-9 * (3.1 if phase == "fwdbwd" else 1.0) + 0.04
    else:
        fwd, fwdbwd = OP_MS[mixer]
        ms = (fwd if phase == "fwd" else fwdbwd) * tokens / 65536 * (1 + 0.12 * math.log2(T / 256))
    if mode == "layer":
        ms += tokens / 65536 * (4.0 if phase == "fwd" else 12.0)
    return ms * (1 if gpu else 150) * slow


def throughput(w: Writer, mixer: str, preset: str, device: str, *, when=None, slow: float = 1.0) -> RunRecord:
    cfg = get_task("throughput").Config(**get_task("throughput").presets[preset])
    gpu = device == H200
    rng = random.Random(f"{mixer}{preset}{device}{when}")
    points = []
    for mode in cfg.modes:
        for sweep in cfg.sweeps:
            for phase in ("fwd", "fwdbwd"):
                for T in cfg.seq_lens:
                    B = max(1, cfg.token_budget // T) if sweep == "budget" else cfg.batch_size
                    points.append(_point(mixer, mode, sweep, phase, T, B, gpu, slow, rng))
        dB = cfg.decode_batch_size or cfg.batch_size
        points += [_point(mixer, mode, "decode", "decode", T, dB, gpu, slow, rng) for T in cfg.seq_lens]
    crossovers = []
    if mixer != "softmax":
        series: dict[tuple, list] = {}
        for p in points:
            series.setdefault((p["mode"], p["sweep"], p["phase"]), []).append((p["T"], p["ms"], p["softmax_ms"]))
        crossovers = [{"mode": m, "sweep": s, "phase": ph, **crossover(v).as_dict()} for (m, s, ph), v in series.items()]
    largest = max(cfg.seq_lens)
    pick = {(p["mode"], p["sweep"], p["phase"], p["T"]): p for p in points}
    metrics = {}
    for prefix, mode in (("", "layer"), ("op_", "op")):
        for phase in ("fwd", "fwdbwd", "decode"):
            p = pick[(mode, "decode" if phase == "decode" else "budget", phase, largest)]
            metrics[f"{prefix}{phase}_tokens_per_s"] = p["tokens_per_s"]
    metrics["op_fwdbwd_tflops"] = metrics["op_fwdbwd_tokens_per_s"] * 16 * 128 * 128 * 12 / 1e12
    for c in crossovers:
        if c["T"] is not None and c["sweep"] != "fixed_batch":
            metrics[f"{'' if c['mode'] == 'layer' else 'op_'}crossover_T_{c['phase']}"] = c["T"]
    shapes = {"num_heads": cfg.num_heads, "head_dim": cfg.head_dim, "d_model": cfg.num_heads * cfg.head_dim, "dtype": cfg.dtype}
    details = {"points": points, "crossovers": crossovers, "shapes": shapes, "baselines": {"softmax": "softmax mixer"}}
    return w.write("throughput", mixer, preset, device, metrics, details=details, when=when,
                   backend=("flash_attn" if mixer == "softmax" else "triton") if gpu else "torch")


def _point(mixer, mode, sweep, phase, T, B, gpu, slow, rng) -> dict:
    jitter = lambda: 1 + rng.uniform(-0.03, 0.03)  # noqa: E731
    ms = _speed_ms(mixer, mode, phase, T, B, gpu, slow) * jitter()
    soft = _speed_ms("softmax", mode, phase, T, B, gpu, 1.0) * jitter() if mixer != "softmax" else ms
    tokens = B * (1 if phase == "decode" else T)
    return {"mode": mode, "sweep": sweep, "phase": phase, "T": T, "B": B, "tokens": tokens, "status": "ok", "ms": ms,
            "tokens_per_s": tokens / (ms / 1e3), "softmax_ms": soft, "softmax_status": "ok", "speedup_vs_softmax": soft / ms}


# ---- memory ---------------------------------------------------------------------------------

KIB_PER_TOKEN = {"softmax": 24, "linear": 30, "gla": 44, "deltanet": 40, "gdn": 42, "lin_gdn": 46, "mesa": 64}


def memory(w: Writer, mixer: str, preset: str, device: str, *, when=None) -> RunRecord:
    cfg = get_task("memory").Config(**get_task("memory").presets[preset])
    gpu = device == H200
    points, states = [], []
    for model in dict.fromkeys([mixer, "softmax"]):
        for mode in cfg.modes:
            for T in cfg.lengths():
                layer_extra = (48 * 1024 if mode == "layer" else 0) * (1 if gpu else 0.05)  # projections
                per_token = KIB_PER_TOKEN[model] * 1024 * (1 if gpu else 0.25) + layer_extra
                peak = T * cfg.batch_size * per_token + (0 if gpu or model != "softmax" else T * T * 16)
                oom = cfg.max_bytes is not None and peak > cfg.max_bytes
                points.append({"model": model, "B": cfg.batch_size, "mode": mode, "T": T, "status": "oom" if oom else "ok",
                               "peak_bytes": None if oom else int(peak), "error": "out of memory" if oom else None,
                               "method": "cuda" if gpu else "child", "peak_mib": None if oom else peak / 2**20})
    bytes_per = 2 if cfg.dtype != "float32" else 4
    rec_state = cfg.num_heads * cfg.head_dim * cfg.head_dim * 4 * (2 if mixer == "mesa" else 1)
    for T in cfg.lengths():
        kv = 2 * T * cfg.num_heads * cfg.head_dim * bytes_per
        states.append({"T": T, "state_floats": kv // bytes_per if mixer == "softmax" else rec_state // 4,
                       "softmax_state_floats": kv // bytes_per, "state_bytes": kv if mixer == "softmax" else rec_state,
                       "softmax_state_bytes": kv})
    largest = max(cfg.seq_lens)
    mine = {(p["mode"], p["T"]): p for p in points if p["model"] == mixer}
    metrics = {"peak_mib": mine[("layer", largest)]["peak_mib"] or 0.0, "state_bytes": float(states[-1]["state_bytes"]),
               "max_T_fits": float(max(T for (m, T), p in mine.items() if m == "layer" and p["status"] == "ok"))}
    details = {"points": points, "decode_state": states,
               "shapes": {"num_heads": cfg.num_heads, "head_dim": cfg.head_dim, "dtype": cfg.dtype, "batch_size": cfg.batch_size}}
    return w.write("memory", mixer, preset, device, metrics, details=details, when=when, backend="triton" if gpu else "torch")


# ---- recall ---------------------------------------------------------------------------------

MQAR_AT_64 = {"softmax": 0.995, "mesa": 0.93, "gdn": 0.88, "deltanet": 0.84, "gla": 0.62, "linear": 0.22, "lin_gdn": 0.12}


def mqar(w: Writer, mixer: str, d_model: int, lr: float, *, when=None, shift: float = 0.0) -> RunRecord:
    base = MQAR_AT_64[mixer]
    gain = 1 - (1 - base) * (64 / d_model) ** (0.9 if mixer != "softmax" else 2)
    acc = max(0.0, min(1.0, gain - (0.06 if lr == 3e-3 else 0) + shift))
    heads = 2
    state = 2 * 64 * d_model * 2 if mixer == "softmax" else 2 * heads * (d_model // heads) ** 2 * (2 if mixer == "mesa" else 1)
    metrics = {"accuracy": acc, "accuracy_kv4": min(1, acc + 0.05), "accuracy_kv8": acc, "accuracy_kv16": max(0, acc - 0.08),
               "params": float(12 * d_model**2 + 512 * d_model), "state_size": float(state), "train_time_s": 40 + d_model / 2}
    return w.write("mqar", mixer, "default", CPU, metrics, set_={"model.d_model": d_model, "optim.lr": lr}, when=when,
                   details={"by_setting": [], "state_size_at": 64}, backend="torch")


def niah(w: Writer, mixer: str, weaker: float = 0.0, seed: int = 0) -> RunRecord:
    cfg = get_task("niah").Config(**get_task("niah").presets["gpu"])
    strength = {"softmax": 0.99, "mesa": 0.9, "gdn": 0.85, "gla": 0.6}[mixer] - weaker
    rng = random.Random(mixer)
    cells = []
    for L in cfg.test_lengths:
        for v in cfg.variants:
            for d in cfg.depths:
                far = (1 - d) * L / cfg.train_len  # distance of the needle from the query, in training lengths
                hard = {"multikey": 0.15, "multivalue": 0.1, "single_uuid": 0.05}.get(v.name, 0)
                p = max(0.0, min(1.0, strength - hard - (1 - strength) * far * 0.8 + rng.uniform(-0.04, 0.04)))
                answers = 32 * v.num_answers
                cells.append({"seq_len": L, "variant": v.name, "depth": d, "correct": round(p * answers),
                              "answers": answers, "accuracy": round(p * answers) / answers})
    acc = sum(c["correct"] for c in cells) / sum(c["answers"] for c in cells)
    metrics = {"accuracy": acc, "accuracy_train_len": min(1, acc + 0.1), "accuracy_longest": max(0, acc - 0.15), "params": 4.2e5}
    return w.write("niah", mixer, "gpu", H200, metrics, details={"cells": cells, "state_size_at": max(cfg.test_lengths)},
                   seed=seed)


FIDELITY_OPS = {"lin_gdn": {"lin_gdn": 0.10, "vala": 0.22, "diag_rnn": 0.05}, "linear": {"linear_elu1": 0.55, "linear_raw": 1.4}}
SWAP_ACC = {"lin_gdn": 0.41, "vala": 0.18, "diag_rnn": 0.63, "linear_elu1": 0.06, "linear_raw": 0.02}


def fidelity(w: Writer, mixer: str) -> RunRecord:
    cfg = get_task("fidelity").Config(**get_task("fidelity").presets["default"])
    ops = FIDELITY_OPS[mixer]
    err = lambda op, std, T: min(3.0, ops[op] * std ** 0.8 * (T / 64) ** 0.05)  # noqa: E731
    gaussian = [{"op": op, "logit_std": s, "seq_len": T, "rel_err": err(op, s, T)}
                for op in ops for s in cfg.logit_stds for T in cfg.seq_lens]
    trained = [{"op": op, "layer": layer, "seq_len": T, "rel_err": err(op, 1.5 + layer, T)}
               for op in ops for layer in (0, 1) for T in (16, 64, 256)]
    main = next(iter(ops))
    metrics = {"rel_err": err(main, 1.5, 256), "softmax_accuracy": 0.97, "swap_accuracy": SWAP_ACC[main]}
    details = {"ops": list(ops), "gaussian": gaussian, "trained": trained,
               "mqar_accuracy": {"softmax": 0.97, **{op: SWAP_ACC[op] for op in ops}}}
    return w.write("fidelity", mixer, "default", CPU, metrics, details=details, backend="ops:reference;model:torch")


def make_sample_results(results: Path) -> Path:
    """Fill `results` with the sample records; returns `results`."""
    w = Writer(results)
    for mixer in ["softmax", *RECURRENT_MIXERS]:
        throughput(w, mixer, "gpu", H200)
        memory(w, mixer, "gpu", H200)
    for mixer in ("softmax", "linear", "gdn"):
        throughput(w, mixer, "default", CPU)
        memory(w, mixer, "default", CPU)
    for mixer in MQAR_AT_64:
        for d_model in (32, 64, 128, 256):
            for lr in (3e-3, 1e-2):
                mqar(w, mixer, d_model, lr)
    for mixer in ("softmax", "gdn", "mesa", "gla"):
        niah(w, mixer)
    niah(w, "gdn", weaker=0.4, seed=1)  # a later, worse run (another seed): tables and figures show the best
    for mixer in FIDELITY_OPS:
        fidelity(w, mixer)
    # Nightly: six nights of gdn and softmax throughput and gdn MQAR; the last gdn throughput night is 25% slower.
    for night in range(6):
        when = START + timedelta(days=night + 1, hours=3)
        throughput(w, "gdn", "gpu", H200, when=when, slow=1.33 if night == 5 else 1.0 + 0.02 * (night % 2))
        throughput(w, "softmax", "gpu", H200, when=when + timedelta(minutes=5))
        mqar(w, "gdn", 64, 1e-2, when=when + timedelta(minutes=9), shift=0.01 * ((night % 3) - 1))
    w.write("mqar", "mesa", "default", CPU, {}, set_={"model.d_model": 512}, status="failed",
            error="Traceback (most recent call last):\n  ...\nRuntimeError: CG did not converge in 30 steps")
    return Path(results)
