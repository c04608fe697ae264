"""Checkpoints: a safetensors + config.json folder that MixerLM.from_pretrained loads, tied
weights kept tied, the legacy one-file format still loading, and clear errors."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from tasks.common.checkpoint import CONFIG_FILE, LEGACY_FORMAT, WEIGHTS_FILE, load_checkpoint, save_checkpoint
from tasks.common.model import MixerLM, ModelConfig


def _model(tie: bool = True) -> MixerLM:
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=16, n_layers=2, mixer={"num_heads": 2}, tie_embeddings=tie, base_conv=True)
    return MixerLM("gdn", 40, cfg).eval()


@pytest.mark.parametrize("tie", [True, False])
def test_from_pretrained_rebuilds_the_same_model(tmp_path, tie):
    model = _model(tie)
    path = save_checkpoint(tmp_path / "ckpt", model, {"kind": "ids", "vocab_size": 40}, {"task": "mqar", "seed": 3})
    assert sorted(p.name for p in path.iterdir()) == [CONFIG_FILE, WEIGHTS_FILE]
    config = json.loads((path / CONFIG_FILE).read_text())
    assert config["mixer"] == "gdn" and config["meta"] == {"task": "mqar", "seed": 3}
    loaded = MixerLM.from_pretrained(str(path))
    assert not loaded.training and loaded.config == model.config
    tokens = torch.randint(0, 40, (2, 12))
    torch.testing.assert_close(loaded(tokens), model(tokens), rtol=0, atol=0)
    if tie:
        assert loaded.head.weight is loaded.embed.weight  # still one matrix
        assert len(load_file(str(path / WEIGHTS_FILE))) == len(dict(model.named_parameters()))


def test_a_checkpoint_is_found_from_its_run_folder_and_replaced_in_place(tmp_path):
    run = tmp_path / "run"
    save_checkpoint(run / "checkpoint", _model(), {"kind": "ids"})
    save_checkpoint(run / "checkpoint", _model(tie=False), {"kind": "ids"})  # replaces, no leftovers
    assert [p.name for p in run.iterdir()] == ["checkpoint"]
    assert load_checkpoint(run).model.config.tie_embeddings is False


def test_the_legacy_one_file_format_still_loads(tmp_path):
    model = _model()
    payload = {"format": LEGACY_FORMAT, "mixer": "gdn", "vocab_size": 40, "max_positions": 0,
               "model_config": model.config.model_dump(mode="json"), "tokenizer": {"kind": "ids"}, "meta": {},
               "state_dict": model.state_dict()}
    (tmp_path / "run").mkdir()
    torch.save(payload, tmp_path / "run" / "checkpoint.pt")
    loaded = load_checkpoint(tmp_path / "run")
    tokens = torch.randint(0, 40, (1, 9))
    torch.testing.assert_close(loaded.model(tokens), model(tokens), rtol=0, atol=0)


def test_bad_checkpoints_are_named(tmp_path):
    with pytest.raises(ValueError, match="does not exist; give a checkpoint folder"):
        load_checkpoint(tmp_path / "nothing")
    path = save_checkpoint(tmp_path / "ckpt", _model(), {"kind": "ids"})
    (path / CONFIG_FILE).write_text('{"format": "other/9"}')
    with pytest.raises(ValueError, match="has format 'other/9'"):
        load_checkpoint(path)
    path = save_checkpoint(tmp_path / "ckpt2", _model(), {"kind": "ids"})
    (path / WEIGHTS_FILE).write_bytes(b"garbage")
    with pytest.raises(ValueError, match="model.safetensors cannot be read"):
        load_checkpoint(path)
