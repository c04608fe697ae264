"""CUDA-graphed training steps: the sync-free loss, the mode switch, and (on a GPU) graphed
training against eager training from the same start."""

from __future__ import annotations

import math
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.common.checks import graph_capturing
from tasks.base import RunContext
from tasks.common.model import MixerLM, ModelConfig, scored_positions
from tasks.common.training import LOSS_READ_EVERY, TrainConfig, TrainingDiverged, _read_loss, train, uses_cuda_graph

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@settings(max_examples=40, deadline=None)
@given(B=st.integers(1, 5), T=st.integers(1, 9), p=st.floats(0.0, 1.0), seed=st.integers(0, 2**16))
def test_scored_positions_match_nonzero(B, T, p, seed):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 7, (B, T), generator=g)
    labels[torch.rand(B, T, generator=g) >= p] = -100
    expected = (labels.reshape(-1) != -100).nonzero().squeeze(-1)
    got = scored_positions(labels, int(expected.numel()))
    assert torch.equal(got, expected)


def _lm(mixer="gdn", vocab=32, device="cpu", backend="torch", **model):
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, n_layers=2, mixer={"num_heads": 2, "backend": backend}, **model)
    return MixerLM(mixer, vocab, cfg).to(device)


@pytest.mark.parametrize("mixer", ["gdn", "gla", "softmax"])
def test_loss_with_a_known_count_equals_the_masked_loss(mixer):
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 32, (3, 11), generator=g)
    labels = torch.randint(0, 32, (3, 11), generator=g)
    labels[torch.rand(3, 11, generator=g) < 0.6] = -100
    scored = int((labels != -100).sum())
    a, b = _lm(mixer), _lm(mixer)
    loss_a, pred_a, tgt_a = a.loss(tokens, labels)
    loss_b, pred_b, tgt_b = b.loss(tokens, labels, scored)
    torch.testing.assert_close(loss_b, loss_a)
    assert torch.equal(pred_a, pred_b) and torch.equal(tgt_a, tgt_b)
    loss_a.backward()
    loss_b.backward()
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pb.grad, pa.grad, msg=name)


def test_cuda_graph_mode_switch():
    cpu = torch.device("cpu")
    assert not uses_cuda_graph(TrainConfig(), cpu)
    assert not uses_cuda_graph(TrainConfig(cuda_graph="auto"), cpu)
    with pytest.raises(ValueError, match="cuda_graph=true needs a CUDA device"):
        uses_cuda_graph(TrainConfig(cuda_graph=True), cpu)
    with pytest.raises(ValueError, match="cuda_graph"):
        TrainConfig(cuda_graph="sometimes")
    assert not graph_capturing(torch.zeros(2))


def test_a_non_finite_graphed_loss_is_a_divergence():
    assert _read_loss(torch.tensor(1.5), 10, 0) == 1.5
    with pytest.raises(TrainingDiverged, match=f"read every {LOSS_READ_EVERY} steps"):
        _read_loss(torch.tensor(math.nan), 50, 1)


def _blocks(device="cpu"):
    """Two blocks of different lengths, a label at every third position."""
    g = torch.Generator().manual_seed(3)
    out = []
    for n, t in ((40, 16), (21, 8)):
        x = torch.randint(0, 32, (n, t), generator=g)
        y = torch.randint(0, 32, (n, t), generator=g)
        y[:, ::3] = -100
        out.append((x, y))
    return out


def _ctx(tmp_path, mixer, device):
    return RunContext(mixer=mixer, config=None, device=torch.device(device), seed=0, artifact_dir=tmp_path / "art")


# Triton kernels under capture need real Triton: a session with TRITON_INTERPRET set skips them.
interpreted = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
TRITON_CASES = [pytest.param(m, "triton", marks=pytest.mark.skipif(interpreted, reason="TRITON_INTERPRET is set"))
                for m in ("linear", "gla", "deltanet", "gdn", "lin_gdn", "mesa")]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("mixer, backend", [(m, "torch") for m in ("gdn", "gla", "deltanet", "mesa", "softmax")]
                         + TRITON_CASES)
def test_graphed_training_matches_eager_training(tmp_path, mixer, backend):
    cfg = dict(epochs=3, batch_size=8, lr=3e-3, grad_clip=1.0)
    models = {}
    stats = {}
    for mode in (False, True):
        model = _lm(mixer, device="cuda", backend=backend)
        stats[mode] = train(model, _blocks(), TrainConfig(cuda_graph=mode, **cfg), _ctx(tmp_path, mixer, "cuda"))
        models[mode] = model
        assert set(model.backends()) == {backend}
    on, off = stats[True], stats[False]
    # 5 + 3 batches an epoch in 3 shapes (40 rows = 5 x 8; 21 = 2 x 8 + 5): every later batch replays.
    assert on.step_mode == "cuda_graph" and off.step_mode == "eager"
    assert on.steps == off.steps == 24 and on.graphs == 3 and on.graph_steps == 24 - 3
    # One entry per new shape, its compile and capture split: they add up to new_shape_s.
    assert sorted((s["batch"], s["seq_len"]) for s in on.new_shapes) == [(5, 8), (8, 8), (8, 16)]
    assert all(s["first_step_s"] > 0 and s["capture_s"] > 0 for s in on.new_shapes)
    assert math.isclose(sum(s["first_step_s"] + s["capture_s"] for s in on.new_shapes), on.new_shape_s, rel_tol=1e-6)
    assert off.new_shapes == []
    assert math.isclose(on.final_loss, off.final_loss, rel_tol=1e-3)
    for (name, p_on), p_off in zip(models[True].named_parameters(), models[False].parameters()):
        torch.testing.assert_close(p_on, p_off, rtol=1e-3, atol=1e-4, msg=name)


@pytest.mark.gpu
@needs_gpu
def test_graphed_training_with_dropout_learns(tmp_path):
    """Dropout draws fresh masks on every replay (the graph advances the generator)."""
    model = _lm("gdn", device="cuda", embed_dropout=0.1)
    blocks = [(x, x.clone()) for x, _ in _blocks()]  # copy task: learnable in a few epochs
    cfg = TrainConfig(epochs=30, batch_size=8, lr=1e-2, cuda_graph=True)
    stats = train(model, blocks, cfg, _ctx(tmp_path, "gdn", "cuda"))
    assert stats.graph_steps > 0 and stats.final_loss < 1.0
