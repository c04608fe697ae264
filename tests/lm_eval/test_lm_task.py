"""The `lm` task: a real (seconds-long) run, its metrics, checkpoint and config errors."""

import math

import pytest
import torch

from harness.config import ConfigError, resolve_config
from tasks.base import RunContext
from tasks.common.checkpoint import load_checkpoint
from tasks.lm import LM, validation_loss
from tasks.lm_data import ByteTokenizer, load_documents, split_documents, token_stream, windows
from tasks.registry import get_task


def test_lm_task_trains_scores_and_saves(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(f"Paragraph {i}: the cat sat on mat number {i % 7}." for i in range(400)))
    cfg = resolve_config(get_task("lm"), "tiny", None, [f"corpus={corpus}", "max_train_windows=64", "val_fraction=0.2"])
    ctx = RunContext("gdn", cfg, torch.device("cpu"), 0, tmp_path / "artifacts")
    result = LM().run(ctx)
    m = result.metrics
    assert m["perplexity"] == pytest.approx(math.exp(m["val_loss"]))
    assert m["bits_per_byte"] == pytest.approx(m["val_loss"] / math.log(2))
    assert m["perplexity"] < 257 and m["train_steps"] == 2 and m["val_tokens"] > 0
    assert result.backend == "torch" and result.artifacts == ["checkpoint"]
    assert result.details["documents"]["validation"] > 0 and result.details["corpus"] == [str(corpus)]
    assert isinstance(result.details["sample"]["continuation"], str)

    ckpt = load_checkpoint(tmp_path / "artifacts")
    assert ckpt.mixer == "gdn" and ckpt.tokenizer == {"kind": "bytes", "vocab_size": 257}
    assert ckpt.meta["task"] == "lm" and ckpt.meta["max_length"] == cfg.seq_len
    # The saved model scores the validation windows exactly as the run did.
    tok = ByteTokenizer()
    _, val = split_documents(load_documents(corpus), cfg.val_fraction)
    x, y = (torch.from_numpy(a) for a in windows(token_stream(val, tok), cfg.seq_len, cfg.max_val_windows))
    loss, count = validation_loss(ckpt.model, x, y.masked_fill(y == tok.bos_id, -100), 8, torch.device("cpu"))
    assert loss == pytest.approx(m["val_loss"], rel=1e-5) and count == m["val_tokens"]


def test_lm_presets_resolve_and_bad_corpus_is_clear(tmp_path):
    for preset in LM.presets:
        resolve_config(LM, preset)
    assert LM.primary_metric == "perplexity" and not LM.higher_is_better
    with pytest.raises(ConfigError, match="val_fraction"):
        resolve_config(LM, "tiny", None, ["val_fraction=1.5"])
    cfg = resolve_config(LM, "tiny", None, [f"corpus={tmp_path / 'missing'}"])
    with pytest.raises(ValueError, match="neither a file nor a folder"):
        LM().run(RunContext("gdn", cfg, torch.device("cpu"), 0, tmp_path))
