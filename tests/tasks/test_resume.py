"""A run cut short goes on from its last finished epoch (tasks.common.resume, harness.runner)."""

import dataclasses

import pytest
import torch

import tasks.common.training as training
from harness.config import config_hash, resolve_config
from harness.runner import RunSpec, execute, resume_dir
from harness.tracking import Tracker
from tasks.base import RunContext
from tasks.common.model import MixerLM, ModelConfig
from tasks.common.resume import STATE_FILE
from tasks.common.training import TrainConfig, train
from tasks.registry import get_task


def _lm():
    torch.manual_seed(0)
    return MixerLM("gdn", 16, ModelConfig(d_model=16, n_layers=1, mixer={"num_heads": 2}))


def _blocks():
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 16, (24, 8), generator=g)
    short = torch.randint(0, 16, (10, 4), generator=g)
    return [(x, x.clone()), (short, short.clone())]


def _ctx(tmp_path, resume):
    return RunContext(mixer="gdn", config=None, device=torch.device("cpu"), seed=3, artifact_dir=tmp_path / "art",
                      resume_dir=resume)


class Cut(Exception):
    pass


def _cut_at(evaluation: int):
    """An evaluate() that returns 0.25 until its `evaluation`-th call, which raises Cut (the
    state of the epoch before stays saved)."""
    calls = []

    def evaluate() -> float:
        calls.append(1)
        if len(calls) == evaluation:
            raise Cut
        return 0.25

    return evaluate


@pytest.mark.parametrize("schedule", ["warmup_cosine", "epoch_cosine"])
def test_a_cut_run_resumes_to_the_same_weights(tmp_path, schedule):
    cfg = TrainConfig(epochs=4, batch_size=5, lr=3e-3, early_stop=1.0, schedule=schedule)
    whole = _lm()
    whole_stats = train(whole, _blocks(), cfg, _ctx(tmp_path, None), evaluate=lambda: 0.25)

    resume = tmp_path / "resume"
    with pytest.raises(Cut):
        train(_lm(), _blocks(), cfg, _ctx(tmp_path, resume), evaluate=_cut_at(3))
    assert (resume / STATE_FILE).is_file()
    resumed = _lm()  # fresh weights: everything must come from the saved state
    stats = train(resumed, _blocks(), cfg, _ctx(tmp_path, resume), evaluate=lambda: 0.25)
    assert stats.resumed_at_epoch == 2 and stats.epochs == 4 and stats.steps == whole_stats.steps
    assert [e["epoch"] for e in stats.eval_curve] == [1, 2, 3, 4]
    assert [e["step"] for e in stats.eval_curve] == [e["step"] for e in whole_stats.eval_curve]
    for (name, p), q in zip(whole.named_parameters(), resumed.parameters()):
        torch.testing.assert_close(q, p, rtol=0, atol=0, msg=name)
    assert stats.final_loss == whole_stats.final_loss


def test_an_early_stopped_state_trains_no_further(tmp_path):
    resume = tmp_path / "resume"
    cfg = TrainConfig(epochs=4, batch_size=5, early_stop=0.5)
    first = train(_lm(), _blocks(), cfg, _ctx(tmp_path, resume), evaluate=lambda: 0.75)
    assert first.stop_reason == "early_stop" and first.epochs == 1
    again = train(_lm(), _blocks(), cfg, _ctx(tmp_path, resume), evaluate=lambda: pytest.fail("no evaluation"))
    assert again.stop_reason == "early_stop" and again.epochs == 1 and again.steps == first.steps


def test_a_state_for_another_schedule_is_refused(tmp_path):
    resume = tmp_path / "resume"
    train(_lm(), _blocks(), TrainConfig(epochs=1, batch_size=5), _ctx(tmp_path, resume))
    with pytest.raises(ValueError, match="training steps.*delete it"):
        train(_lm(), _blocks(), TrainConfig(epochs=2, batch_size=5), _ctx(tmp_path, resume))


def test_an_unreadable_state_is_named(tmp_path):
    resume = tmp_path / "resume"
    resume.mkdir()
    (resume / STATE_FILE).write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match="unreadable training state"):
        train(_lm(), _blocks(), TrainConfig(epochs=1, batch_size=5), _ctx(tmp_path, resume))


def test_runner_resumes_a_cut_run_and_clears_its_state(tmp_path, monkeypatch):
    task = get_task("mqar")
    config = resolve_config(task, "tiny", None, ["optim.epochs=3", "optim.early_stop=1.0"])
    spec = RunSpec(mixer="linear", task=task, preset="tiny", config=config, device=torch.device("cpu"), seed=0)
    real = training._train_epochs
    seen = []

    def cut_after_saving(model, blocks, cfg, ctx, evaluate):
        def evaluate_once():
            seen.append(ctx.resume_dir)
            if len(seen) == 2:
                raise KeyboardInterrupt
            return evaluate()
        return real(model, blocks, cfg, ctx, evaluate_once)

    monkeypatch.setattr(training, "_train_epochs", cut_after_saving)
    with pytest.raises(KeyboardInterrupt):
        execute(spec, tmp_path, Tracker(enabled=False))
    folder = resume_dir(tmp_path, "mqar", config_hash("linear", "mqar", config.model_dump(mode="json"), 0), "cpu")
    assert seen[0] == folder and (folder / STATE_FILE).is_file()
    monkeypatch.setattr(training, "_train_epochs", real)
    record, _ = execute(spec, tmp_path, Tracker(enabled=False))
    assert record.status == "ok"
    assert record.details["train_step"]["resumed_at_epoch"] == 1
    assert record.metrics["epochs_run"] == 3
    assert not folder.exists()


def test_resume_dir_is_per_run_key(tmp_path):
    a = resume_dir(tmp_path, "mqar", "abc", "cuda")
    assert a != resume_dir(tmp_path, "mqar", "abc", "cpu") and a != resume_dir(tmp_path, "mqar", "abd", "cuda")
    assert a.parent.parent == tmp_path / ".resume"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cut_graphed_run_resumes_close_to_the_whole_run(tmp_path):
    # Graphed steps on the GPU: the same maths, but atomics in the backward make it not bitwise.
    cfg = TrainConfig(epochs=3, batch_size=5, lr=3e-3, early_stop=1.0, cuda_graph=True)
    ctx = dataclasses.replace(_ctx(tmp_path, None), device=torch.device("cuda"))
    whole = _lm().cuda()
    train(whole, _blocks(), cfg, ctx, evaluate=lambda: 0.25)
    resume = tmp_path / "resume"
    with pytest.raises(Cut):
        train(_lm().cuda(), _blocks(), cfg, dataclasses.replace(ctx, resume_dir=resume), evaluate=_cut_at(2))
    resumed = _lm().cuda()
    stats = train(resumed, _blocks(), cfg, dataclasses.replace(ctx, resume_dir=resume), evaluate=lambda: 0.25)
    assert stats.resumed_at_epoch == 1 and stats.step_mode == "cuda_graph" and stats.graph_steps > 0
    for (name, p), q in zip(whole.named_parameters(), resumed.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5, msg=name)


def test_a_state_of_another_model_is_refused_by_name(tmp_path):
    resume = tmp_path / "resume"
    train(_lm(), _blocks(), TrainConfig(epochs=1, batch_size=5), _ctx(tmp_path, resume))
    torch.manual_seed(0)
    other = MixerLM("gdn", 16, ModelConfig(d_model=16, n_layers=2, mixer={"num_heads": 2}))
    with pytest.raises(ValueError, match="(?s)does not take the saved training state.*delete it"):
        train(other, _blocks(), TrainConfig(epochs=1, batch_size=5), _ctx(tmp_path, resume))
