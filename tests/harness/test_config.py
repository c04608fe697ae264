"""Config resolution: presets, files, --set, and the errors they give."""

import pytest

from harness.config import ConfigError, config_hash, resolve_config, validate_mixer_options
from tasks import get_task


def test_set_overrides_and_types():
    mqar = get_task("mqar")
    cfg = resolve_config(mqar, "tiny", None, ["optim.lr=3e-3", "model.d_model=48", "model.mixer.num_heads=4"])
    assert cfg.optim.lr == pytest.approx(3e-3)
    assert cfg.model.d_model == 48
    assert cfg.model.mixer["num_heads"] == 4


def test_unknown_key_names_valid_keys():
    with pytest.raises(ConfigError, match=r"unknown key 'optim.learning_rate'.*optim\.lr"):
        resolve_config(get_task("mqar"), "tiny", None, ["optim.learning_rate=1"])


def test_wrong_type_names_key():
    with pytest.raises(ConfigError, match=r"model\.d_model"):
        resolve_config(get_task("mqar"), "tiny", None, ["model.d_model=big"])


def test_unknown_preset():
    with pytest.raises(ConfigError, match="valid presets: default"):
        resolve_config(get_task("mqar"), "huge", None, [])


def test_config_file(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("optim:\n  epochs: 3\nvocab_size: 256\n")
    cfg = resolve_config(get_task("mqar"), "tiny", f, ["optim.epochs=4"])
    assert cfg.optim.epochs == 4 and cfg.vocab_size == 256
    f.write_text("nonsense: 1\n")
    with pytest.raises(ConfigError, match="unknown key 'nonsense'"):
        resolve_config(get_task("mqar"), "tiny", f, [])


def test_impossible_setting_rejected():
    with pytest.raises(ConfigError, match="too short"):
        resolve_config(get_task("mqar"), "tiny", None, ["train=[{seq_len: 8, num_kv_pairs: 4, num_examples: 2}]"])


def test_mixer_options_validated():
    cfg = resolve_config(get_task("mqar"), "tiny", None, ["model.mixer.num_hedas=2"])
    with pytest.raises(ConfigError, match="num_hedas"):
        validate_mixer_options("gdn", cfg)


def test_hash_stable():
    assert config_hash("a", "t", {"x": 1, "y": [1]}, 0) == config_hash("a", "t", {"y": [1], "x": 1}, 0)
    assert config_hash("a", "t", {"x": 1}, 0) != config_hash("a", "t", {"x": 1}, 1)
