"""The LM around a mixer keeps the mixer's own initialisation (no LM-wide re-init)."""

import math

import torch

from mixers import build_mixer
from tasks.common.model import MixerLM, ModelConfig


def test_mixer_parameters_are_not_reinitialised():
    torch.manual_seed(0)
    lm = MixerLM("gdn", 64, ModelConfig(d_model=64, n_layers=1))
    mixer = lm.blocks[0].mixer
    # torch's Linear default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), std = 1/sqrt(3 fan_in)
    expected = 1 / math.sqrt(3 * 64)
    for proj in (mixer.q_proj, mixer.k_proj, mixer.v_proj, mixer.a_proj, mixer.b_proj):
        assert abs(proj.weight.std().item() - expected) < 0.25 * expected, proj
    assert mixer.b_proj.bias.abs().sum() > 0, "biases keep their default (non-zero) init"
    # the mixer's deliberate decay init survives: exp(A_log) in [1, 16]
    assert (mixer.A_log.exp() >= 1).all() and (mixer.A_log.exp() <= 16).all()


def test_same_seed_same_weights_as_a_bare_mixer():
    torch.manual_seed(3)
    lm = MixerLM("deltanet", 32, ModelConfig(d_model=32, n_layers=1))
    torch.manual_seed(3)
    torch.nn.Embedding(32, 32)  # built first inside MixerLM
    bare = build_mixer("deltanet", 32, {})
    for (name, p), (_, q) in zip(lm.blocks[0].mixer.named_parameters(), bare.named_parameters()):
        assert torch.equal(p, q), name

