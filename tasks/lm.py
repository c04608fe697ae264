"""LM: byte-level language-model pretraining on a local text corpus, scored by validation
perplexity, and saved as a checkpoint that `harness eval` (lm-evaluation-harness) reads.

The corpus is a text file or a folder of them (default: the shipped generated corpus,
data/tiny_corpus.txt); its paragraphs are documents, each starting with BOS, split into
train/validation by a stable hash of their text (tasks/lm_data.py). Training runs over
non-overlapping windows of `seq_len` bytes; perplexity is per byte over the validation
windows (predictions of BOS, i.e. of a document's end, are not scored)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from pydantic import Field

from tasks.base import RunContext, Task, TaskConfig, TaskResult
from tasks.common.checkpoint import CHECKPOINT_FILE, save_checkpoint
from tasks.common.decoding import greedy_decode
from tasks.common.model import MixerLM, ModelConfig
from tasks.common.training import TrainConfig, train, uses_cuda_graph
from tasks.lm_data import ByteTokenizer, corpus_files, load_documents, split_documents, token_stream, windows
from tasks.registry import register_task


class LMConfig(TaskConfig):
    corpus: str | None = Field(None, description="text file or folder of .txt/.md files; None: the shipped tiny corpus")
    val_fraction: float = Field(0.05, gt=0, lt=1, description="share of documents (paragraphs) held out for validation")
    seq_len: int = Field(128, ge=2, description="training window length in bytes; also the checkpoint's max_length")
    max_train_windows: int | None = Field(None, ge=1, description="cap on training windows (None: the whole train split)")
    max_val_windows: int | None = Field(None, ge=1, description="cap on validation windows (None: the whole split)")
    save_checkpoint: bool = Field(True, description=f"write {CHECKPOINT_FILE} next to the record (for harness eval)")
    sample_prompt: str = Field("After Monday comes", description="greedy sample kept in the record's details")
    sample_tokens: int = Field(48, ge=0, description="bytes generated for the sample (0: none)")
    model: ModelConfig = Field(default_factory=ModelConfig)
    optim: TrainConfig = Field(default_factory=TrainConfig)


def _model(d_model: int, n_layers: int, heads: int = 2) -> dict:
    return {"d_model": d_model, "n_layers": n_layers, "mixer": {"num_heads": heads}}


@register_task("lm")
class LM(Task):
    description = "byte-level LM pretraining on a local corpus: validation perplexity per byte, checkpoint for harness eval"
    Config = LMConfig
    primary_metric = "perplexity"
    higher_is_better = False
    setting_fields = ("corpus", "val_fraction", "seq_len", "max_train_windows", "max_val_windows")
    shown_metrics = ("bits_per_byte", "params", "train_time_s")
    presets = {
        # Calibrated on 2 CPU cores: a couple of minutes per mixer on the shipped corpus.
        "default": {"seq_len": 128, "model": _model(128, 2), "optim": {"epochs": 3, "batch_size": 32, "lr": 3e-3}},
        # Seconds, for smoke tests and CI.
        "tiny": {
            "seq_len": 64, "max_train_windows": 256, "max_val_windows": 32, "sample_tokens": 8,
            "model": _model(32, 1), "optim": {"epochs": 1, "batch_size": 32, "lr": 3e-3},
        },
        # GPU: a wider, deeper model on longer windows (give a bigger corpus with --set corpus=PATH).
        "gpu": {"seq_len": 512, "model": _model(512, 4, 4), "optim": {"epochs": 10, "batch_size": 64, "lr": 1e-3}},
    }

    @classmethod
    def check_config(cls, config: LMConfig, device_type: str) -> None:
        files = corpus_files(config.corpus)  # a missing corpus or an empty folder, named
        if not any(f.stat().st_size for f in files):
            raise ValueError(f"corpus {config.corpus} holds no text: {'its files are' if len(files) > 1 else 'the file is'} "
                             "empty; give a text file or a folder of .txt/.md files with text in them")
        uses_cuda_graph(config.optim, torch.device(device_type))

    def run(self, ctx: RunContext) -> TaskResult:
        cfg: LMConfig = ctx.config
        tok = ByteTokenizer()
        train_docs, val_docs = split_documents(load_documents(cfg.corpus), cfg.val_fraction)
        train_windows = windows(token_stream(train_docs, tok), cfg.seq_len, cfg.max_train_windows)
        train_x, train_y = (torch.from_numpy(a) for a in train_windows)
        val_x, val_y = (torch.from_numpy(a) for a in windows(token_stream(val_docs, tok), cfg.seq_len, cfg.max_val_windows))
        val_y = val_y.masked_fill(val_y == tok.bos_id, -100)  # per-byte perplexity: document ends are not scored

        torch.manual_seed(ctx.seed)
        model = MixerLM(ctx.mixer, tok.vocab_size, cfg.model, max_positions=cfg.seq_len).to(ctx.device)
        stats = train(model, [(train_x, train_y)], cfg.optim, ctx)
        val_loss, val_tokens = validation_loss(model, val_x, val_y, cfg.optim.eval_batch_size, ctx.device)

        metrics = {
            "perplexity": math.exp(val_loss), "bits_per_byte": val_loss / math.log(2), "val_loss": val_loss,
            "val_tokens": float(val_tokens), "train_tokens": float((train_y != -100).sum()),
            "params": float(model.num_parameters()), "state_size": float(model.state_size(cfg.seq_len)),
            "train_time_s": stats.train_time_s, "final_loss": stats.final_loss, "train_steps": float(stats.steps),
        }
        details = {
            "corpus": [str(p) for p in corpus_files(cfg.corpus)],
            "documents": {"train": len(train_docs), "validation": len(val_docs)},
        }
        if cfg.sample_tokens:
            prompt = torch.tensor([[tok.bos_id, *tok.encode(cfg.sample_prompt)]], device=ctx.device)
            model.eval()
            out = greedy_decode(model, prompt, cfg.sample_tokens, lambda _, ids: ids[-1] == tok.bos_id)[0]
            details["sample"] = {"prompt": cfg.sample_prompt, "continuation": tok.decode(out)}
        artifacts = []
        if cfg.save_checkpoint:
            meta = {"task": "lm", "task_config": cfg.model_dump(mode="json"), "seed": ctx.seed, "max_length": cfg.seq_len}
            save_checkpoint(ctx.artifact_dir / CHECKPOINT_FILE, model, tok.info(), meta)
            artifacts.append(CHECKPOINT_FILE)
        return TaskResult(metrics=metrics, backend=",".join(sorted(set(model.backends()))), details=details, artifacts=artifacts)


@torch.no_grad()
def validation_loss(model: MixerLM, inputs: torch.Tensor, labels: torch.Tensor, batch_size: int,
                    device: torch.device) -> tuple[float, int]:
    """Mean next-token cross-entropy (nats) over positions with labels != -100, and their count."""
    model.eval()
    total, count = 0.0, 0
    for start in range(0, inputs.shape[0], batch_size):
        x = inputs[start : start + batch_size].to(device)
        y = labels[start : start + batch_size].to(device)
        mask = y != -100
        if not mask.any():
            continue
        logits = model(x, mask)
        total += float(F.cross_entropy(logits.float(), y[mask], reduction="sum"))
        count += int(mask.sum())
    model.train()
    if count == 0:
        raise ValueError("the validation split has no scored tokens; raise val_fraction or max_val_windows")
    return total / count, count
