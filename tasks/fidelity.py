"""Fidelity: how closely each gate-free linear op approximates causal softmax attention
on the same q, k, v (docs/design.md §5, §7).

A run measures the ops of one mixer family against exact causal softmax (fp64), as the
relative error ||o - o_softmax|| / ||o_softmax|| by sequence length T:
  - on Gaussian q, k, v, one curve per logit scale (std of q'.k);
  - on the q, k, v that a small softmax MQAR model, trained in the task, feeds its
    attention layers;
and swaps that trained model's attention for each op with the same weights (no training),
reporting the MQAR accuracy of each swapped model next to the softmax model's own.

Families (--mixer -> ops measured; the first is the mixer's own op, the primary metric):
  lin_gdn: lin_gdn (GDN form), vala (first-order form), diag_rnn (the quadratic seed-000
           reference: exact recursion, first-order diagonal weights), lin_gdn_bal (the GDN
           form after a logit-preserving rescale that gives q' and k equal mean norms)
  linear:  linear_elu1 (elu+1 feature map, normalised), linear_raw (identity, unnormalised)
Only these can take a softmax model's q, k, v as they are; the other mixers need trained
gates (gla, deltanet, gdn, mesa) or are the reference itself (softmax)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from pydantic import Field

from tasks.base import RunContext, Task, TaskConfig, TaskResult
from tasks.common.curves import Curve, CurvePanel, save_curve_panels
from tasks.common.model import MixerLM
from tasks.common.training import train
from tasks.fidelity_math import (
    OPS,
    balance_factor,
    gaussian_qkv,
    prefix_rel_err,
    softmax_op,
)
from tasks.fidelity_swap import (
    Swap,
    capture_qkv,
    mqar_accuracy,
    qk_stats,
    swapped_model,
)
from tasks.mqar import MQAR, MQARConfig, MQARSetting
from tasks.registry import register_task

CURVES_FILE = "fidelity_curves.png"


@dataclass(frozen=True)
class Family:
    ops: tuple[str, ...]  # the first is the mixer's own op (the primary metric)
    swaps: dict[str, Swap]


FAMILIES: dict[str, Family] = {
    "lin_gdn": Family(
        ops=("lin_gdn", "vala", "diag_rnn", "lin_gdn_bal"),
        swaps={"lin_gdn": Swap("lin_gdn", {"form": "gdn"}), "vala": Swap("lin_gdn", {"form": "vala"}),
               "diag_rnn": Swap(None, patch="diag_rnn"), "lin_gdn_bal": Swap(None, patch="lin_gdn_bal")},
    ),
    "linear": Family(
        ops=("linear_elu1", "linear_raw"),
        swaps={"linear_elu1": Swap("linear", {"feature_map": "elu1", "normalize": True}),
               "linear_raw": Swap("linear", {"feature_map": "identity", "normalize": False})},
    ),
}


def check_mixer(name: str) -> None:
    """ValueError unless `name` is a mixer whose op(s) fidelity can measure."""
    if name not in FAMILIES:
        raise ValueError(
            f"fidelity needs a gate-free op that takes a softmax model's q, k, v as they are; got mixer {name!r}. "
            f"Valid mixers: {', '.join(FAMILIES)} (lin_gdn: {', '.join(FAMILIES['lin_gdn'].ops)}; "
            f"linear: {', '.join(FAMILIES['linear'].ops)}). softmax is the reference every op is compared with; "
            f"gla, deltanet, gdn and mesa need trained gates."
        )


def _mqar(train_n: int, epochs: int) -> dict:
    return {
        "vocab_size": 256,
        "train": [{"seq_len": 64, "num_kv_pairs": 8, "num_examples": train_n}],
        "test": [{"seq_len": 64, "num_kv_pairs": 8, "num_examples": 500}],
        "model": {"d_model": 64, "n_layers": 2, "mixer": {"num_heads": 2}},
        "optim": {"epochs": epochs, "batch_size": 64, "lr": 1e-2},
    }


class FidelityConfig(TaskConfig):
    seq_lens: list[int] = Field(default_factory=lambda: [16, 64, 256, 1024], min_length=1,
                                description="T at which Gaussian errors are reported (prefixes of one run at max T)")
    logit_stds: list[float] = Field(default_factory=lambda: [0.25, 0.5, 1.0, 2.0, 4.0], min_length=1,
                                    description="std of the Gaussian logits q'.k")
    batch: int = Field(4, ge=1, description="Gaussian sequences per scale")
    heads: int = Field(2, ge=1)
    head_dim: int = Field(64, ge=1)
    op_backend: Literal["reference", "torch"] = Field("reference", description="backend of the linear ops (fp64)")
    mqar: MQARConfig = Field(default_factory=lambda: MQARConfig(**_mqar(8_000, 4)),
                             description="the softmax MQAR model trained in the task")
    capture: MQARSetting = Field(default_factory=lambda: MQARSetting(seq_len=256, num_kv_pairs=32, num_examples=32),
                                 description="MQAR sequences whose attention q, k, v are captured")


def _tag(x: float) -> str:
    return f"{x:g}".replace(".", "p")


@register_task("fidelity")
class Fidelity(Task):
    description = "relative error of gate-free linear ops vs causal softmax, by T and logit scale; swapped-in MQAR accuracy"
    Config = FidelityConfig
    primary_metric = "rel_err"
    higher_is_better = False
    setting_fields = ("seq_lens", "logit_stds", "batch", "heads", "head_dim", "mqar", "capture")
    shown_metrics = ("softmax_accuracy", "swap_accuracy")
    presets = {
        # About 1-1.5 min per mixer on 2 idle CPU cores; the softmax MQAR model reaches 99.7 %.
        "default": {"mqar": _mqar(8_000, 4)},
        "tiny": {
            "seq_lens": [8, 32], "logit_stds": [0.5, 2.0], "batch": 1, "head_dim": 16,
            "mqar": {**_mqar(256, 1), "vocab_size": 64, "test": [{"seq_len": 64, "num_kv_pairs": 8, "num_examples": 32}],
                     "model": {"d_model": 32, "n_layers": 1, "mixer": {"num_heads": 2}}},
            "capture": {"seq_len": 32, "num_kv_pairs": 4, "num_examples": 4},
        },
        "gpu": {
            "seq_lens": [64, 256, 1024, 4096], "batch": 8, "op_backend": "torch",
            "mqar": {**_mqar(40_000, 16), "model": {"d_model": 128, "n_layers": 2, "mixer": {"num_heads": 2}}},
            "capture": {"seq_len": 1024, "num_kv_pairs": 64, "num_examples": 64},
        },
    }

    check_mixer = staticmethod(check_mixer)

    def run(self, ctx: RunContext) -> TaskResult:
        check_mixer(ctx.mixer)  # before any work
        cfg: FidelityConfig = ctx.config
        family = FAMILIES[ctx.mixer]
        gaussian = self._gaussian(cfg, family, ctx)

        torch.manual_seed(ctx.seed)
        longest = max(s.seq_len for s in [*cfg.mqar.train, *cfg.mqar.test])
        softmax_model = MixerLM("softmax", cfg.mqar.vocab_size, cfg.mqar.model, max_positions=longest).to(ctx.device)
        train_x, train_y = MQAR._data(cfg.mqar, cfg.mqar.train, ctx.seed, split=0)
        stats = train(softmax_model, [(train_x, train_y)], cfg.mqar.optim, dataclasses.replace(ctx, mixer="softmax"))
        test_blocks = [MQAR._data(cfg.mqar, [s], ctx.seed, split=1) for s in cfg.mqar.test]

        trained, layers = self._trained(cfg, family, softmax_model, ctx)
        batch = cfg.mqar.optim.eval_batch_size
        accuracy = {"softmax": mqar_accuracy(softmax_model, test_blocks, batch, ctx.device)}
        swap_backends = {}
        for op in family.ops:
            swap = family.swaps[op]
            model = swapped_model(softmax_model, swap, [torch.tensor(layer["balance"]) for layer in layers])
            accuracy[op] = mqar_accuracy(model, test_blocks, batch, ctx.device)
            swap_backends[op] = f"patched:{swap.patch}" if swap.mixer is None else ",".join(sorted(set(model.backends())))

        main = family.ops[0]
        metrics = {"rel_err": trained[main]["pooled"], "softmax_accuracy": accuracy["softmax"],
                   "swap_accuracy": accuracy[main]}
        for op in family.ops:
            metrics[f"rel_err_{op}_trained"] = trained[op]["pooled"]
            for std in cfg.logit_stds:
                metrics[f"rel_err_{op}_std{_tag(std)}"] = gaussian[op][std][-1]
            metrics[f"swap_accuracy_{op}"] = accuracy[op]
        metrics.update(softmax_train_time_s=stats.train_time_s, softmax_final_loss=stats.final_loss)

        ctx.artifact_dir.mkdir(parents=True, exist_ok=True)
        self._plot(cfg, family, gaussian, trained, ctx.mixer, ctx.artifact_dir / CURVES_FILE)
        model_backend = ",".join(sorted(set(softmax_model.backends())))
        details = {
            "ops": list(family.ops),
            "gaussian": [{"op": op, "logit_std": std, "seq_len": T, "rel_err": gaussian[op][std][i]}
                         for op in family.ops for std in cfg.logit_stds for i, T in enumerate(cfg.seq_lens)],
            "trained": [{"op": op, "layer": layer, "seq_len": T, "rel_err": err}
                        for op in family.ops for layer, curve in enumerate(trained[op]["layers"])
                        for T, err in zip(trained[op]["seq_lens"], curve)],
            "trained_layers": layers,
            "mqar_accuracy": accuracy,
            "backends": {"ops": cfg.op_backend, "softmax_model": model_backend, **swap_backends},
        }
        return TaskResult(metrics=metrics, backend=f"ops:{cfg.op_backend};model:{model_backend}", details=details,
                          artifacts=[CURVES_FILE])

    @staticmethod
    def _gaussian(cfg: FidelityConfig, family: Family, ctx: RunContext) -> dict[str, dict[float, list[float]]]:
        """errors[op][logit_std] = rel. error at each of cfg.seq_lens (prefixes of one run at the longest)."""
        T = max(cfg.seq_lens)
        errors: dict[str, dict[float, list[float]]] = {op: {} for op in family.ops}
        bar = ctx.progress.add_task("fidelity: gaussian", total=len(cfg.logit_stds))
        for i, std in enumerate(cfg.logit_stds):
            seed = int(np.random.SeedSequence([ctx.seed, 3, i]).generate_state(1)[0])
            q, k, v = gaussian_qkv(cfg.batch, T, cfg.heads, cfg.head_dim, std, torch.Generator().manual_seed(seed))
            q, k, v = q.to(ctx.device), k.to(ctx.device), v.to(ctx.device)
            ref = softmax_op(q, k, v, 1.0, "reference")
            for op in family.ops:
                curve = prefix_rel_err(OPS[op](q, k, v, 1.0, cfg.op_backend), ref)
                errors[op][std] = [float(curve[t - 1]) for t in cfg.seq_lens]
            ctx.progress.advance(bar)
        ctx.progress.remove_task(bar)
        return errors

    @staticmethod
    def _trained(cfg: FidelityConfig, family: Family, model: MixerLM, ctx: RunContext):
        """Errors of each op on the q, k, v of every attention layer of the trained model,
        and per layer its logit scale, q'/k norms and balance factors."""
        x, _ = MQAR._data(cfg.mqar, [cfg.capture], ctx.seed, split=2)
        T = cfg.capture.seq_len
        lens = sorted({t for t in cfg.seq_lens if t < T} | {T})
        out = {op: {"layers": [], "seq_lens": lens, "sq": 0.0} for op in family.ops}
        ref_sq, layers = 0.0, []
        for q, k, v in capture_qkv(model, x.to(ctx.device)):
            q, k, v = q.double(), k.double(), v.double()
            ref = softmax_op(q, k, v, None, "reference")
            ref_sq += float(ref.pow(2).sum())
            for op in family.ops:
                o = OPS[op](q, k, v, None, cfg.op_backend)
                curve = prefix_rel_err(o, ref)
                out[op]["layers"].append([float(curve[t - 1]) for t in lens])
                out[op]["sq"] += float((o - ref).pow(2).sum())
            layers.append({**qk_stats(q, k), "balance": balance_factor(q, k).tolist()})
        for op in family.ops:
            out[op]["pooled"] = (out[op].pop("sq") / ref_sq) ** 0.5  # all layers, full length
        return out, layers

    @staticmethod
    def _plot(cfg, family, gaussian, trained, mixer, path) -> None:
        """Per op: error vs T, one line per logit scale (trained layers dashed); last: all ops vs scale."""
        panels = []
        for op in family.ops:
            curves = [Curve(f"logit std {std:g}", cfg.seq_lens, gaussian[op][std]) for std in cfg.logit_stds]
            curves += [Curve(f"trained layer {i}", trained[op]["seq_lens"], c, dashed=True)
                       for i, c in enumerate(trained[op]["layers"])]
            panels.append(CurvePanel(op, "sequence length T", "||o - o_softmax|| / ||o_softmax||", curves))
        T = max(cfg.seq_lens)
        by_scale = [Curve(op, cfg.logit_stds, [gaussian[op][s][-1] for s in cfg.logit_stds]) for op in family.ops]
        panels.append(CurvePanel(f"all ops at T = {T}", "logit std of q'.k", "relative error", by_scale))
        if "vala" in family.ops:  # the seed's claim: below 1 means closer to softmax than VaLA
            ratios = [Curve(op, cfg.logit_stds, [gaussian[op][s][-1] / gaussian["vala"][s][-1] for s in cfg.logit_stds])
                      for op in family.ops]  # vala's own line (1) keeps the colours of the panel before
            panels.append(CurvePanel(f"error / VaLA's error at T = {T}", "logit std of q'.k", "ratio", ratios,
                                     logy=False))
        save_curve_panels(panels, path, f"fidelity to causal softmax: {mixer} family", columns=3)
