"""NIAH: token-level needle in a haystack for small models trained from scratch.

Train at one context length on a mixture of RULER-like variants, then test at that length
and longer ones with the target needle at every depth of a grid. The model is the MQAR
model (no position embedding: order comes from the short convolution and the mixer), so a
longer context than seen in training is a fair test of the mixer's recall."""

from __future__ import annotations

import math

import numpy as np
import torch
from pydantic import Field, model_validator

from tasks.base import RunContext, Task, TaskConfig, TaskResult, stage
from tasks.common.datacache import cached_arrays
from tasks.common.heatmap import HeatmapPanel, save_heatmaps
from tasks.common.model import UNGATED_OUTPUT, MixerLM, ModelConfig
from tasks.common.training import (
    TrainConfig,
    float32_matmul,
    predict,
    step_details,
    train,
    uses_cuda_graph,
)
from tasks.niah_data import (
    GENERATOR_VERSION,
    NIAHBlock,
    NIAHVariant,
    NIAHVocab,
    answer_correct,
    check_variant,
    make_niah,
)
from tasks.registry import register_task

HEATMAP_FILE = "niah_heatmap.png"


def _variants(*specs: dict) -> list[dict]:
    return [dict(spec) for spec in specs]


# RULER's NIAH family, at token level.
RULER_VARIANTS = _variants(
    {"name": "single_repeat", "haystack": "repeat"},  # passkey: one needle in a repeated pattern
    {"name": "single_random"},  # one needle in random tokens
    {"name": "single_uuid", "value_len": 4},  # one needle, a 4-token value
    {"name": "multikey", "keys": 4},  # 3 distractor needles with other keys
    {"name": "multivalue", "values_per_key": 4},  # 4 values for one key, all scored
    {"name": "multiquery", "keys": 4, "queries": 4},  # 4 needles, all queried
)


class NIAHConfig(TaskConfig):
    num_keys: int = Field(64, ge=1, description="key tokens")
    num_values: int = Field(128, ge=1, description="value tokens")
    num_filler: int = Field(64, ge=1, description="haystack tokens")
    pattern_len: int = Field(16, ge=1, description="period of the repeated haystack")
    variants: list[NIAHVariant] = Field(default_factory=lambda: [NIAHVariant(**v) for v in RULER_VARIANTS], min_length=1)
    train_len: int = Field(64, ge=8, description="context length of every training sequence")
    train_examples: int = Field(32_000, ge=1, description="training sequences, split evenly over the variants")
    test_lengths: list[int] = Field(default_factory=lambda: [64, 128, 256, 512], min_length=1)
    depths: list[float] = Field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0], min_length=1,
                                description="target-needle depths tested (0 = start, 1 = just before the query)")
    test_examples: int = Field(16, ge=1, description="test sequences per (length, variant, depth)")
    eval_tokens: int = Field(32_768, ge=1, description="tokens per evaluation batch (batch = eval_tokens // length)")
    model: ModelConfig = Field(default_factory=ModelConfig)
    optim: TrainConfig = Field(default_factory=TrainConfig)

    @property
    def vocab(self) -> NIAHVocab:
        return NIAHVocab(self.num_keys, self.num_values, self.num_filler, self.pattern_len)

    @model_validator(mode="after")
    def _settings_fit(self):
        names = [v.name for v in self.variants]
        if len(set(names)) != len(names):
            raise ValueError(f"variant names must be unique, got {names}")
        if any(not 0.0 <= d <= 1.0 for d in self.depths) or len(set(self.depths)) != len(self.depths):
            raise ValueError(f"depths must be distinct values in [0, 1], got {self.depths}")
        if len(set(self.test_lengths)) != len(self.test_lengths):
            raise ValueError(f"test_lengths must be distinct, got {self.test_lengths}")
        for variant in self.variants:
            for length in (self.train_len, *self.test_lengths):
                check_variant(variant, length, self.vocab)
        return self


def _model(d_model: int, n_layers: int, **extra) -> dict:
    return {"d_model": d_model, "n_layers": n_layers, "mixer": {"num_heads": 2}, **extra}


@register_task("niah")
class NIAH(Task):
    description = "needle in a haystack (RULER-like variants): train short, test long, accuracy by length x depth"
    Config = NIAHConfig
    setting_fields = ("num_keys", "num_values", "num_filler", "pattern_len", "variants", "train_len",
                      "test_lengths", "depths")
    shown_metrics = ("accuracy_train_len", "accuracy_longest", "params", "train_time_s")
    presets = {
        # 2000 steps, as MQAR's default: about 3-4.5 min per mixer on 2 idle CPU cores (softmax 3, lin_gdn 4.5;
        # mesa about twice that); softmax reaches 98 %. Tested up to 8x the training length. The gated
        # mixers run without the SiLU output gate, as in MQAR's default (gla: 0.005 with it, 0.97 without).
        "default": {
            "train_len": 64, "train_examples": 32_000, "test_lengths": [64, 128, 256, 512],
            "depths": [0.0, 0.25, 0.5, 0.75, 1.0], "test_examples": 16,
            "model": _model(64, 2, per_mixer=UNGATED_OUTPUT), "optim": {"epochs": 4, "batch_size": 64, "lr": 1e-2},
        },
        # Seconds, for smoke tests and CI.
        "tiny": {
            "num_keys": 16, "num_values": 32, "num_filler": 16, "pattern_len": 4,
            "train_len": 48, "train_examples": 192, "test_lengths": [48, 96], "depths": [0.0, 0.5, 1.0],
            "test_examples": 2, "model": _model(32, 1), "optim": {"epochs": 1, "batch_size": 64, "lr": 1e-2},
        },
        # GPU: train at 1k, test at 1k-8k on an 11-point depth grid (not yet run on a GPU). The LM
        # is the one GDN learns MQAR with at this width (tied embeddings, no MLP, no output
        # gate; results/ablations/README.md): with MLP blocks and an untied head it did not.
        "gpu": {
            "train_len": 1024, "train_examples": 48_000, "test_lengths": [1024, 2048, 4096, 8192],
            "depths": [i / 10 for i in range(11)], "test_examples": 32, "eval_tokens": 262_144,
            "model": _model(128, 2, state_mixer="identity", tie_embeddings=True, per_mixer=UNGATED_OUTPUT),
            "optim": {"epochs": 4, "batch_size": 64, "lr": 3e-3, "cuda_graph": "auto"},
        },
    }

    @classmethod
    def check_config(cls, config: NIAHConfig, device_type: str) -> None:
        uses_cuda_graph(config.optim, torch.device(device_type))

    @classmethod
    def chance_loss(cls, config: NIAHConfig) -> float:
        """Uniform over the value tokens: knowing an answer is a value, not which one."""
        return math.log(config.num_values)

    def run(self, ctx: RunContext) -> TaskResult:
        cfg: NIAHConfig = ctx.config
        with stage(ctx, "generating or loading the data"):
            train_x, train_y = self._train_data(cfg, ctx.seed)
        torch.manual_seed(ctx.seed)
        longest = max(cfg.train_len, *cfg.test_lengths)
        model = MixerLM(ctx.mixer, cfg.vocab.size, cfg.model, max_positions=longest).to(ctx.device)
        stats = train(model, [(train_x, train_y)], cfg.optim, ctx)

        depths = np.asarray(cfg.depths)
        # hits[length, variant, depth] and counts alike, answers tallied by their needle's depth
        hits = np.zeros((len(cfg.test_lengths), len(cfg.variants), len(depths)))
        counts = np.zeros_like(hits)
        bar = ctx.progress.add_task(f"test {ctx.mixer}", total=len(cfg.test_lengths) * len(cfg.variants))
        for li, length in enumerate(cfg.test_lengths):
            for vi, variant in enumerate(cfg.variants):
                block = self._test_block(cfg, variant, length, ctx.seed)
                batch = max(1, cfg.eval_tokens // length)
                # torch.tensor copies: cached blocks are read-only arrays, which from_numpy would share
                inputs, labels = torch.tensor(block.inputs), torch.tensor(block.labels)
                with float32_matmul(cfg.optim.matmul_precision):
                    correct = predict(model, inputs, labels, batch, ctx.device)
                ok = answer_correct(correct.numpy(), block.answer_ids, variant.num_answers)
                bucket = np.abs(block.answer_depths[..., None] - depths).argmin(-1)
                np.add.at(hits[li, vi], bucket.ravel(), ok.ravel())
                np.add.at(counts[li, vi], bucket.ravel(), 1)
                ctx.progress.advance(bar)
        ctx.progress.remove_task(bar)

        metrics = self._metrics(cfg, hits, counts)
        metrics.update(
            params=float(model.num_parameters()), state_size=float(model.state_size(max(cfg.test_lengths))),
            train_time_s=stats.train_time_s, final_loss=stats.final_loss, train_steps=float(stats.steps),
        )
        ctx.artifact_dir.mkdir(parents=True, exist_ok=True)
        self._plot(cfg, ctx.mixer, hits, counts, ctx.artifact_dir / HEATMAP_FILE)
        cells = [
            {"seq_len": length, "variant": variant.name, "depth": float(depth),
             "correct": int(hits[li, vi, di]), "answers": int(counts[li, vi, di]),
             "accuracy": float(hits[li, vi, di] / counts[li, vi, di]) if counts[li, vi, di] else None}
            for li, length in enumerate(cfg.test_lengths)
            for vi, variant in enumerate(cfg.variants)
            for di, depth in enumerate(depths)
        ]
        return TaskResult(
            metrics=metrics, backend=",".join(sorted(set(model.backends()))),
            details={"cells": cells, "state_size_at": max(cfg.test_lengths), "train_step": step_details(stats)},
            artifacts=[HEATMAP_FILE],
        )

    @staticmethod
    def _metrics(cfg: NIAHConfig, hits: np.ndarray, counts: np.ndarray) -> dict[str, float]:
        """Accuracy per (length, variant) pooled over depths; summaries are unweighted means of those."""
        by_lv = hits.sum(-1) / counts.sum(-1)  # [lengths, variants]
        metrics = {"accuracy": float(by_lv.mean())}
        for li, length in enumerate(cfg.test_lengths):
            metrics[f"accuracy_len{length}"] = float(by_lv[li].mean())
        for vi, variant in enumerate(cfg.variants):
            metrics[f"accuracy_{variant.name}"] = float(by_lv[:, vi].mean())
        with np.errstate(invalid="ignore"):
            by_depth = np.nanmean(hits / counts, axis=(0, 1))
        for di, depth in enumerate(cfg.depths):
            metrics[f"accuracy_depth{round(depth * 100)}"] = float(by_depth[di])
        longest = int(np.argmax(cfg.test_lengths))
        metrics["accuracy_longest"] = float(by_lv[longest].mean())
        if cfg.train_len in cfg.test_lengths:
            metrics["accuracy_train_len"] = float(by_lv[cfg.test_lengths.index(cfg.train_len)].mean())
        return metrics

    @staticmethod
    def _plot(cfg: NIAHConfig, mixer: str, hits: np.ndarray, counts: np.ndarray, path) -> None:
        """One heatmap of length x depth averaged over variants, then one per variant."""
        with np.errstate(invalid="ignore"):
            acc = hits / counts
        order = np.argsort(cfg.test_lengths)
        rows = [str(cfg.test_lengths[i]) for i in order]
        cols = [f"{round(d * 100)}%" for d in cfg.depths]
        acc = acc[order]
        with np.errstate(invalid="ignore"):
            mean = np.nanmean(acc, axis=1)
        panels = [HeatmapPanel("all variants (mean)", mean, rows, cols, "context length", "needle depth")]
        panels += [HeatmapPanel(v.name, acc[:, vi], rows, cols, "context length", "needle depth")
                   for vi, v in enumerate(cfg.variants)]
        save_heatmaps(panels, path, f"NIAH accuracy, {mixer} (trained at length {cfg.train_len})", columns=4)

    @staticmethod
    def _cached(cfg: NIAHConfig, variant: NIAHVariant, n: int, length: int, seed: int,
                depths: np.ndarray | None) -> NIAHBlock:
        spec = {
            "v": GENERATOR_VERSION, "vocab": [cfg.num_keys, cfg.num_values, cfg.num_filler, cfg.pattern_len],
            "variant": variant.model_dump(), "n": n, "seq_len": length, "seed": seed,
            "depths": None if depths is None else depths.tolist(),
        }
        arrays = cached_arrays("niah", spec, lambda: make_niah(variant, n, length, cfg.vocab, seed, depths).as_dict())
        return NIAHBlock(**{name: np.asarray(a) for name, a in arrays.items()})

    @classmethod
    def _train_data(cls, cfg: NIAHConfig, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The training mixture: train_examples split evenly over the variants, random depths."""
        share, extra = divmod(cfg.train_examples, len(cfg.variants))
        xs, ys = [], []
        for i, variant in enumerate(cfg.variants):
            n = share + (i < extra)
            if n == 0:
                continue
            # Train (split 0) and test (split 1) streams come from disjoint seed sequences.
            sub = int(np.random.SeedSequence([seed, 0, cfg.train_len, i]).generate_state(1)[0])
            block = cls._cached(cfg, variant, n, cfg.train_len, sub, None)
            xs.append(block.inputs)
            ys.append(block.labels)
        return torch.from_numpy(np.concatenate(xs)).long(), torch.from_numpy(np.concatenate(ys)).long()

    @classmethod
    def _test_block(cls, cfg: NIAHConfig, variant: NIAHVariant, length: int, seed: int) -> NIAHBlock:
        """test_examples sequences per depth of the grid, target needle at that depth."""
        depths = np.repeat(np.asarray(cfg.depths, dtype=np.float64), cfg.test_examples)
        index = [v.name for v in cfg.variants].index(variant.name)
        sub = int(np.random.SeedSequence([seed, 1, length, index]).generate_state(1)[0])
        return cls._cached(cfg, variant, len(depths), length, sub, depths)
