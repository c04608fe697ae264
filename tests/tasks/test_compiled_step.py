"""optim.compile: training steps through torch.compile match eager steps from the same start,
and the option is left out of a run's key (a compiled rerun of a recorded run counts as done)."""

from __future__ import annotations

import math

import pytest
import torch

from harness.config import config_hash
from tasks.common.training import TrainConfig, compiled_loss, train
from tests.tasks.test_graphed_step import _ctx, _lm


def _one_shape_block() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """16 rows of 12 tokens, a label at every third position: batches of 8 are one shape, one compile."""
    g = torch.Generator().manual_seed(3)
    x, y = torch.randint(0, 32, (16, 12), generator=g), torch.randint(0, 32, (16, 12), generator=g)
    y[:, ::3] = -100
    return [(x, y)]


@pytest.mark.parametrize("mixer", ["gdn", "mesa"])
def test_compiled_loss_matches_the_eager_loss_and_gradients(mixer):
    (x, y), = _one_shape_block()
    x, y = x[:8], y[:8]
    scored = int((y != -100).sum())
    eager, compiled = _lm(mixer), _lm(mixer)
    loss_e = eager.loss(x, y, scored)[0]
    loss_c = compiled_loss(compiled)(x, y, scored)[0]
    torch.testing.assert_close(loss_c, loss_e, rtol=1e-5, atol=1e-6)
    loss_e.backward()
    loss_c.backward()
    for (name, p_c), p_e in zip(compiled.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p_c.grad, p_e.grad, rtol=1e-4, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}")


def test_compiled_training_runs_the_same_steps_and_loss(tmp_path):
    # Parameters are not compared: AdamW turns a rounding difference in a near-zero gradient
    # into an O(lr) difference in that weight; the gradients are held above.
    cfg = dict(epochs=3, batch_size=8, lr=3e-3, grad_clip=1.0)
    stats = {c: train(_lm("gdn"), _one_shape_block(), TrainConfig(compile=c, **cfg), _ctx(tmp_path, "gdn", "cpu"))
             for c in (False, True)}
    assert stats[True].steps == stats[False].steps == 6
    assert math.isclose(stats[True].final_loss, stats[False].final_loss, rel_tol=1e-4)


def test_compile_is_not_part_of_the_run_key():
    base = {"optim": TrainConfig().model_dump(mode="json"), "model": {"d_model": 8}}
    compiled = {**base, "optim": {**base["optim"], "compile": True}}
    recorded = {**base, "optim": {k: v for k, v in base["optim"].items() if k != "compile"}}
    assert config_hash("gdn", "mqar", compiled, 0) == config_hash("gdn", "mqar", base, 0)
    assert config_hash("gdn", "mqar", recorded, 0) == config_hash("gdn", "mqar", base, 0)
    other_lr = {**base, "optim": {**base["optim"], "lr": 0.5}}
    assert config_hash("gdn", "mqar", other_lr, 0) != config_hash("gdn", "mqar", base, 0)


def test_compiled_loss_keeps_one_graph_per_length_across_batch_sizes():
    # A recall task's last batch of each setting is partial: with the batch dynamic it reuses
    # its length's graph instead of compiling again; a new length is a new graph.
    from torch._dynamo.utils import counters

    torch._dynamo.reset()  # graphs other tests compiled for this code would be reused here
    g = torch.Generator().manual_seed(5)
    model = _lm("gdn")
    loss_fn = compiled_loss(model)
    before = counters["stats"]["unique_graphs"]
    for rows, length in ((8, 12), (5, 12), (3, 12), (8, 24)):
        x, y = torch.randint(0, 32, (rows, length), generator=g), torch.randint(0, 32, (rows, length), generator=g)
        y[:, ::2] = -100
        scored = int((y != -100).sum())
        torch.testing.assert_close(loss_fn(x, y, scored)[0], model.loss(x, y, scored)[0], rtol=1e-5, atol=1e-6)
    assert counters["stats"]["unique_graphs"] - before == 2


def test_a_narrower_batch_is_padded_to_the_widest_graph():
    # Inductor's CPU code for a dynamic batch guards `33 <= batch`: a last batch of 8 rows after
    # batches of 40 compiled a second graph before partial batches were padded. The padded rows
    # are unscored, so the loss and the gradients are those of the 8 rows alone.
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    g = torch.Generator().manual_seed(9)
    model, eager = _lm("gdn"), _lm("gdn")
    model.eval(), eager.eval()  # dropout off: padded and unpadded steps then draw nothing
    loss_fn = compiled_loss(model)
    before = counters["stats"]["unique_graphs"]
    for rows in (40, 8, 40, 3):
        x, y = torch.randint(0, 32, (rows, 64), generator=g), torch.randint(0, 32, (rows, 64), generator=g)
        y[:, ::2] = -100  # 64 tokens, one whole chunk: at 12 tokens no guard on the batch arises
        scored = int((y != -100).sum())
        for p in (*model.parameters(), *eager.parameters()):
            p.grad = None
        loss_c, pred_c, target_c = loss_fn(x, y, scored)
        loss_e, pred_e, target_e = eager.loss(x, y, scored)
        torch.testing.assert_close(loss_c, loss_e, rtol=1e-5, atol=1e-6)
        assert torch.equal(target_c, target_e) and pred_c.shape == (scored,)
        loss_c.backward()
        loss_e.backward()
        for (name, p_c), p_e in zip(model.named_parameters(), eager.parameters()):
            torch.testing.assert_close(p_c.grad, p_e.grad, rtol=1e-4, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}")
    assert counters["stats"]["unique_graphs"] - before == 1
