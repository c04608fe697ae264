"""Shared fixtures: isolated caches (HF_HOME, HARNESS_CACHE), small checkpoints, one
lm-eval TaskManager per session over our exported tasks."""

from __future__ import annotations

import os

import pytest
import torch

from tasks.common.checkpoint import save_checkpoint
from tasks.common.model import MixerLM, ModelConfig
from tasks.lm_data import ByteTokenizer, IdTokenizer


@pytest.fixture(scope="session", autouse=True)
def isolated_caches(tmp_path_factory):
    """Hugging Face and harness caches in a temporary folder for the whole session."""
    root = tmp_path_factory.mktemp("lm_eval_caches")
    saved = {k: os.environ.get(k) for k in ("HF_HOME", "HARNESS_CACHE", "HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")}
    os.environ.update(HF_HOME=str(root / "hf"), HARNESS_CACHE=str(root / "harness"),
                      HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
    yield root
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def small_model(mixer: str, vocab_size: int, seed: int = 0) -> MixerLM:
    torch.manual_seed(seed)
    return MixerLM(mixer, vocab_size, ModelConfig(d_model=32, n_layers=2, mlp_ratio=2.0, mixer={"num_heads": 2})).eval()


@pytest.fixture(scope="session")
def byte_checkpoint(tmp_path_factory):
    """An untrained byte-level gdn model saved as an `lm` checkpoint (max_length 64)."""
    path = tmp_path_factory.mktemp("byte_ckpt") / "checkpoint"
    meta = {"task": "lm", "task_config": {"corpus": None, "val_fraction": 0.05}, "seed": 0, "max_length": 64}
    return save_checkpoint(path, small_model("gdn", ByteTokenizer.vocab_size), ByteTokenizer().info(), meta)


@pytest.fixture(scope="session")
def ids_checkpoint(tmp_path_factory):
    """An untrained softmax model over 40 token ids."""
    path = tmp_path_factory.mktemp("ids_ckpt") / "checkpoint"
    return save_checkpoint(path, small_model("softmax", 40, seed=1), IdTokenizer(40).info(), {"task": "none", "max_length": 64})


@pytest.fixture(scope="session")
def lm_eval_module():
    return pytest.importorskip("lm_eval")
