"""MQAR: multi-query associative recall (Zoology), a small LM trained from scratch."""

from __future__ import annotations

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from tasks.base import RunContext, Task, TaskConfig, TaskResult
from tasks.common.checkpoint import CHECKPOINT_FILE, save_checkpoint
from tasks.common.datacache import cached_arrays
from tasks.common.model import MixerLM, ModelConfig
from tasks.common.training import TrainConfig, predict, train
from tasks.lm_data import IdTokenizer
from tasks.mqar_data import GENERATOR_VERSION, check_setting, make_mqar
from tasks.registry import register_task


class MQARSetting(BaseModel):
    """One block of sequences: its length, kv pairs per sequence and how many sequences."""

    model_config = ConfigDict(extra="forbid")

    seq_len: int = Field(ge=4)
    num_kv_pairs: int = Field(ge=1)
    num_examples: int = Field(ge=1)


class MQARConfig(TaskConfig):
    vocab_size: int = Field(512, ge=8)
    power_a: float = Field(0.01, gt=0, le=1, description="power-law exponent of the query gaps")
    random_non_queries: bool = Field(True, description="fill non-query positions with random tokens")
    train: list[MQARSetting] = Field(default_factory=lambda: [MQARSetting(seq_len=64, num_kv_pairs=8, num_examples=20_000)])
    test: list[MQARSetting] = Field(default_factory=lambda: [MQARSetting(seq_len=64, num_kv_pairs=8, num_examples=1_000)])
    model: ModelConfig = Field(default_factory=ModelConfig)
    optim: TrainConfig = Field(default_factory=TrainConfig)
    save_checkpoint: bool = Field(False, description=f"write {CHECKPOINT_FILE} next to the record (for harness eval)")

    @model_validator(mode="after")
    def _settings_fit(self):
        for s in [*self.train, *self.test]:
            check_setting(s.seq_len, s.num_kv_pairs, self.vocab_size)
        return self


def _setting(seq_len, kv, n):
    return {"seq_len": seq_len, "num_kv_pairs": kv, "num_examples": n}


@register_task("mqar")
class MQAR(Task):
    description = "multi-query associative recall (Zoology): accuracy on recalled values"
    Config = MQARConfig
    setting_fields = ("vocab_size", "power_a", "random_non_queries", "train", "test")
    shown_metrics = ("params", "state_size", "train_time_s")
    presets = {
        # Calibrated on 2 CPU cores: a few minutes per mixer, and softmax clearly above linear.
        "default": {
            "vocab_size": 512,
            "train": [_setting(64, 8, 8_000)],
            "test": [_setting(64, 4, 500), _setting(64, 8, 1_000), _setting(64, 16, 500)],
            "model": {"d_model": 64, "n_layers": 2, "mixer": {"num_heads": 2}},
            "optim": {"epochs": 8, "batch_size": 64, "lr": 1e-2},
        },
        # Seconds, for smoke tests and CI.
        "tiny": {
            "vocab_size": 128,
            "train": [_setting(32, 4, 512)],
            "test": [_setting(32, 4, 128)],
            "model": {"d_model": 32, "n_layers": 1, "mixer": {"num_heads": 2}},
            "optim": {"epochs": 1, "batch_size": 64, "lr": 1e-2},
        },
        # The Zoology paper's setting (GPU): vocabulary 8192, lengths 64-512, 4-64 kv pairs.
        "paper": {
            "vocab_size": 8192,
            "train": [
                _setting(64, 4, 100_000), _setting(128, 8, 20_000), _setting(256, 16, 20_000),
                _setting(256, 32, 20_000), _setting(256, 64, 20_000),
            ],
            "test": [
                _setting(64, 4, 1_000), _setting(64, 8, 1_000), _setting(64, 16, 1_000), _setting(128, 32, 1_000),
                _setting(256, 64, 1_000), _setting(512, 64, 1_000), _setting(512, 128, 1_000),
            ],
            "model": {"d_model": 128, "n_layers": 2, "mixer": {"num_heads": 2}},
            "optim": {"epochs": 64, "batch_size": 256, "lr": 1e-3},
        },
    }

    def run(self, ctx: RunContext) -> TaskResult:
        cfg: MQARConfig = ctx.config
        train_x, train_y = self._data(cfg, cfg.train, ctx.seed, split=0)
        test_blocks = [self._data(cfg, [s], ctx.seed, split=1) for s in cfg.test]

        torch.manual_seed(ctx.seed)
        model = MixerLM(ctx.mixer, cfg.vocab_size, cfg.model).to(ctx.device)
        stats = train(model, train_x, train_y, cfg.optim, ctx)

        metrics: dict[str, float] = {}
        by_setting, correct_total, scored_total = [], 0, 0
        by_kv: dict[int, list[int]] = {}
        for s, (x, y) in zip(cfg.test, test_blocks):
            correct = predict(model, x, y, cfg.optim.eval_batch_size, ctx.device)
            scored = int((y != -100).sum())
            hits = int(correct.sum())
            correct_total, scored_total = correct_total + hits, scored_total + scored
            tally = by_kv.setdefault(s.num_kv_pairs, [0, 0])
            tally[0], tally[1] = tally[0] + hits, tally[1] + scored
            by_setting.append({**s.model_dump(), "accuracy": hits / scored})
        metrics["accuracy"] = correct_total / scored_total
        for kv, (hits, scored) in sorted(by_kv.items()):
            metrics[f"accuracy_kv{kv}"] = hits / scored
        longest = max(s.seq_len for s in cfg.test)
        metrics.update(
            params=float(model.num_parameters()),
            state_size=float(model.state_size(longest)),
            train_time_s=stats.train_time_s,
            final_loss=stats.final_loss,
            train_steps=float(stats.steps),
        )
        ctx.log({f"test/{k}": v for k, v in metrics.items()}, stats.steps)
        backends = sorted(set(model.backends()))
        artifacts = []
        if cfg.save_checkpoint:
            meta = {"task": "mqar", "task_config": cfg.model_dump(mode="json"), "seed": ctx.seed,
                    "max_length": max(s.seq_len for s in [*cfg.train, *cfg.test])}
            save_checkpoint(ctx.artifact_dir / CHECKPOINT_FILE, model, IdTokenizer(cfg.vocab_size).info(), meta)
            artifacts.append(CHECKPOINT_FILE)
        return TaskResult(
            metrics=metrics, backend=",".join(backends),
            details={"by_setting": by_setting, "state_size_at": longest}, artifacts=artifacts,
        )

    @staticmethod
    def _data(cfg: MQARConfig, settings: list[MQARSetting], seed: int, split: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Concatenate the settings' sequences, padding shorter ones (label -100) to the longest."""
        length = max(s.seq_len for s in settings)
        xs, ys = [], []
        for i, s in enumerate(settings):
            # Train (split 0) and test (split 1) streams come from disjoint seed sequences.
            sub_seed = np.random.SeedSequence([seed, split, s.seq_len, s.num_kv_pairs, i]).generate_state(1)[0]
            spec = {
                "v": GENERATOR_VERSION, "vocab": cfg.vocab_size, "power_a": cfg.power_a,
                "random_non_queries": cfg.random_non_queries, "seed": int(sub_seed), **s.model_dump(),
            }
            arrays = cached_arrays("mqar", spec, lambda s=s, sd=int(sub_seed): dict(zip(
                ("inputs", "labels"),
                make_mqar(s.num_examples, s.seq_len, s.num_kv_pairs, cfg.vocab_size, sd, cfg.power_a, cfg.random_non_queries),
            )))
            x, y = arrays["inputs"], arrays["labels"]
            if s.seq_len < length:
                x = np.pad(x, ((0, 0), (0, length - s.seq_len)))
                y = np.pad(y, ((0, 0), (0, length - s.seq_len)), constant_values=-100)
            xs.append(x)
            ys.append(y)
        return torch.from_numpy(np.concatenate(xs)).long(), torch.from_numpy(np.concatenate(ys)).long()
