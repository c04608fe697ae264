"""Zoology-faithful MQAR: distinct values (generator v2), the mean-over-settings headline,
per-setting batching, early stopping, the zoology preset's model, BaseConv decoding, the
mixers' expand_k / expand_v / output_norm options and per_mixer validation."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from torch import nn

import tasks.mqar as mqar_module
from harness.config import ConfigError, resolve_config, validate_mixer_options
from mixers import build_mixer
from tasks.base import RunContext
from tasks.common.base_conv import BaseConv
from tasks.common.decoding import decode_step, prefill
from tasks.common.model import MixerLM, ModelConfig
from tasks.common.training import TrainConfig, TrainingDiverged, _optimizer, epoch_batches, lr_at, train
from tasks.mqar import MQAR, MQARConfig, mean_accuracy, settings_metrics
from tasks.mqar_data import GENERATOR_VERSION, check_setting, distinct_draws, make_mqar
from tasks.registry import get_task

MIXERS = ["softmax", "linear", "gla", "deltanet", "gdn", "lin_gdn", "mesa"]


@pytest.fixture(autouse=True)
def _isolated_cache_and_seeds(tmp_path, monkeypatch):
    """A fresh data cache per test, and every global RNG seeded (tests also seed their own)."""
    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path / "cache"))
    torch.manual_seed(0)
    np.random.seed(0)


def _ctx(tmp_path, mixer="linear", config=None, seed=0):
    return RunContext(mixer=mixer, config=config, device=torch.device("cpu"), seed=seed, artifact_dir=tmp_path / "art")


def _chi2_bound(dof: int) -> float:
    """A loose upper bound for a chi-square statistic (mean dof, sd sqrt(2 dof)): about 6 sd."""
    return dof + 6 * math.sqrt(2 * dof)


# -- 1. the generator: distinct keys and values, labels, version ------------------------------


@pytest.mark.parametrize(
    "L,kv,V",
    [
        (64, 8, 512),  # small draw from a large pool: the rejection path
        (64, 16, 64),  # 16 * 16 > 31 keys: the argpartition path
        (128, 31, 64),  # keys: all 31 of the pool (argsort); values: 31 of 32 (argpartition)
        (40, 10, 24),  # 11 keys, 12 values: kv close to both pools
    ],
)
def test_keys_and_values_distinct_and_labels_match(L, kv, V):
    x, y = make_mqar(300, L, kv, V, seed=7)
    half = V // 2
    keys, values = x[:, 0 : 2 * kv : 2], x[:, 1 : 2 * kv : 2]
    assert ((keys >= 1) & (keys < half)).all() and ((values >= half) & (values < V)).all()
    for row_k, row_v, row_x, row_y in zip(keys, values, x, y):
        assert len(set(row_k.tolist())) == kv, "keys distinct within a sequence"
        assert len(set(row_v.tolist())) == kv, "values distinct within a sequence (generator v2)"
        lookup = dict(zip(row_k.tolist(), row_v.tolist()))
        scored = np.flatnonzero(row_y != -100)
        assert len(scored) == kv
        assert sorted(row_x[scored].tolist()) == sorted(lookup), "every key queried once"
        for pos in scored:
            assert row_y[pos] == lookup[row_x[pos]], "label at a query = the value paired with the queried key"


def test_values_not_all_the_same_set():
    # With kv = 31 of 32 values every row omits one value; it must vary across rows.
    x, _ = make_mqar(200, 128, 31, 64, seed=1)
    values = x[:, 1:62:2]
    missing = [sorted(set(range(32, 64)) - set(r.tolist())) for r in values]
    assert all(len(m) == 1 for m in missing)
    assert len({m[0] for m in missing}) > 10


def test_setting_limits_on_distinct_keys_and_values():
    # vocab 8: keys 1..3, values 4..7. Values never run out before keys do (the value pool is
    # never smaller than the key pool), so the key message is the one a user sees.
    check_setting(64, 3, 8)
    make_mqar(4, 64, 3, 8, seed=0)  # kv = the whole key pool works
    with pytest.raises(ValueError, match="distinct keys"):
        check_setting(64, 4, 8)
    check_setting(64, 4, 10)  # vocab 10: 4 keys (1..4), 5 values
    with pytest.raises(ValueError, match="vocab_size=8"):
        MQARConfig(vocab_size=8, train=[{"seq_len": 64, "num_kv_pairs": 5, "num_examples": 2}])


def test_generator_version_and_cache_spec(monkeypatch):
    assert GENERATOR_VERSION == 2
    specs = []

    def fake_cached_arrays(kind, spec, make):
        specs.append((kind, dict(spec)))
        return make()

    monkeypatch.setattr(mqar_module, "cached_arrays", fake_cached_arrays)
    cfg = MQARConfig(vocab_size=64, train=[{"seq_len": 32, "num_kv_pairs": 4, "num_examples": 8}],
                     test=[{"seq_len": 32, "num_kv_pairs": 4, "num_examples": 4}])
    x, y = MQAR._data(cfg, cfg.train, seed=0, split=0)
    assert x.shape == y.shape == (8, 32)
    assert len(specs) == 1
    kind, spec = specs[0]
    assert kind == "mqar"
    assert spec["v"] == 2, "v1 cache entries (values with replacement) must not be reused"
    assert spec["vocab"] == 64 and spec["seq_len"] == 32 and spec["num_kv_pairs"] == 4


def test_cache_entry_differs_from_version_1(monkeypatch):
    from tasks.common.datacache import cache_key

    specs = []
    monkeypatch.setattr(mqar_module, "cached_arrays", lambda kind, spec, make: specs.append(spec) or make())
    cfg = MQARConfig(**MQAR.presets["tiny"])
    MQAR._data(cfg, cfg.train, seed=0, split=0)
    v1 = {**specs[0], "v": 1}
    assert cache_key(specs[0]) != cache_key(v1)


# -- 2. distinct_draws ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "count,low,high",
    [
        (3, 10, 110),  # 9 <= 100: rejection path
        (8, 5, 25),  # 64 > 20: argpartition path
        (20, 0, 20),  # count == pool: full argsort (random permutations)
    ],
)
def test_distinct_draws_uniform_and_distinct(count, low, high):
    rows = 6000
    out = distinct_draws(np.random.default_rng(0), rows, count, low, high)
    assert out.shape == (rows, count) and out.dtype == np.int64
    assert out.min() >= low and out.max() < high
    assert (np.diff(np.sort(out, axis=1), axis=1) > 0).all(), "each row distinct"
    pool = high - low
    # every column's marginal is uniform over the pool
    for j in range(count):
        counts = np.bincount(out[:, j] - low, minlength=pool)
        expected = rows / pool
        chi2 = ((counts - expected) ** 2 / expected).sum()
        assert chi2 < _chi2_bound(pool - 1), (j, chi2)
    # the order within a row is random (not sorted, not biased)
    assert abs(np.mean(out[:, 0] < out[:, 1]) - 0.5) < 0.03
    # distinct rows across the draw (not the same subset repeated)
    assert len({tuple(r) for r in out[:200].tolist()}) > 190


def test_distinct_draws_chunked_large_pool():
    # pool 2**20: chunks of 4 rows; count**2 > pool takes the score path.
    pool, count, rows = 1 << 20, 1100, 10
    out = distinct_draws(np.random.default_rng(1), rows, count, 3, 3 + pool)
    assert out.shape == (rows, count)
    assert out.min() >= 3 and out.max() < 3 + pool
    assert all(len(set(r.tolist())) == count for r in out)
    assert len({tuple(r) for r in out.tolist()}) == rows, "chunks do not repeat each other"


def test_distinct_draws_deterministic():
    a = distinct_draws(np.random.default_rng(5), 50, 4, 0, 100)
    b = distinct_draws(np.random.default_rng(5), 50, 4, 0, 100)
    np.testing.assert_array_equal(a, b)


# -- 3. the headline ---------------------------------------------------------------------------


def _row(seq_len, kv, hits, scored):
    return {"seq_len": seq_len, "num_kv_pairs": kv, "num_examples": 1, "accuracy": hits / scored,
            "hits": hits, "scored": scored}


def test_settings_metrics_mean_vs_pooled():
    by_setting = [_row(64, 4, 1, 2), _row(128, 8, 100, 400), _row(256, 8, 750, 1000)]
    m = settings_metrics(by_setting)
    assert m["accuracy"] == (0.5 + 0.25 + 0.75) / 3 == 0.5
    assert mean_accuracy(by_setting) == 0.5
    assert m["accuracy_pooled"] == 851 / 1402
    assert m["accuracy_pooled"] != m["accuracy"]
    assert m["accuracy_kv4"] == 0.5
    assert m["accuracy_kv8"] == 850 / 1400, "per kv count: pooled over its settings"
    assert m["accuracy_T64_kv4"] == 0.5
    assert m["accuracy_T128_kv8"] == 0.25
    assert m["accuracy_T256_kv8"] == 0.75
    assert set(m) == {"accuracy", "accuracy_pooled", "accuracy_kv4", "accuracy_kv8",
                      "accuracy_T64_kv4", "accuracy_T128_kv8", "accuracy_T256_kv8"}


# -- 4. per-setting batching -------------------------------------------------------------------


def _blocks(sizes_lengths):
    return [(torch.zeros(n, t, dtype=torch.long), torch.zeros(n, t, dtype=torch.long)) for n, t in sizes_lengths]


def test_epoch_batches_one_block_per_batch_every_row_once():
    blocks = _blocks([(10, 8), (7, 16), (3, 4)])
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):  # three epochs from one generator
        batches = epoch_batches(blocks, 4, gen)
        assert len(batches) == 3 + 2 + 1
        seen = {b: [] for b in range(3)}
        for b, idx in batches:
            assert 1 <= len(idx) <= 4
            assert int(idx.max()) < blocks[b][0].shape[0], "a batch indexes one block only"
            seen[b] += idx.tolist()
        for b, (x, _) in enumerate(blocks):
            assert sorted(seen[b]) == list(range(x.shape[0])), "every row exactly once per epoch"
    # batches of the blocks are interleaved, not block after block
    orders = [[b for b, _ in epoch_batches(blocks, 4, torch.Generator().manual_seed(s))] for s in range(5)]
    assert any(o != sorted(o) for o in orders)


def test_epoch_batches_single_block_is_the_old_randperm_order():
    blocks = _blocks([(23, 5)])
    batches = epoch_batches(blocks, 5, torch.Generator().manual_seed(11))
    order = torch.randperm(23, generator=torch.Generator().manual_seed(11))
    assert [b for b, _ in batches] == [0] * 5
    assert torch.equal(torch.cat([idx for _, idx in batches]), order)
    assert [len(idx) for _, idx in batches] == [5, 5, 5, 5, 3]


def test_per_setting_blocks_equal_padded_rows():
    cfg = MQARConfig(vocab_size=64, train=[{"seq_len": 32, "num_kv_pairs": 4, "num_examples": 20},
                                           {"seq_len": 16, "num_kv_pairs": 2, "num_examples": 10},
                                           {"seq_len": 24, "num_kv_pairs": 3, "num_examples": 6}])
    px, py = MQAR._data(cfg, cfg.train, seed=3, split=0)
    blocks = MQAR._blocks(cfg, cfg.train, seed=3, split=0)
    assert [tuple(x.shape) for x, _ in blocks] == [(20, 32), (10, 16), (6, 24)]
    start = 0
    for (bx, by), s in zip(blocks, cfg.train):
        n, t = s.num_examples, s.seq_len
        assert torch.equal(bx, px[start : start + n, :t])
        assert torch.equal(by, py[start : start + n, :t])
        assert (px[start : start + n, t:] == 0).all() and (py[start : start + n, t:] == -100).all()
        start += n
    assert start == px.shape[0]


# -- 5. early stopping ------------------------------------------------------------------------


def _small_lm(mixer="linear", vocab=16, **model):
    torch.manual_seed(0)
    return MixerLM(mixer, vocab, ModelConfig(d_model=16, n_layers=1, mixer={"num_heads": 2}, **model))


def _toy_blocks():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 16, (12, 8), generator=g)
    return [(x, x.clone()), (x[:5, :4].clone(), x[:5, :4].clone())]


def test_train_stops_early_once_target_reached(tmp_path):
    blocks = _toy_blocks()
    accuracies = iter([0.5, 0.995, 1.0, 1.0])
    calls = []

    def evaluate():
        calls.append(1)
        return next(accuracies)

    cfg = TrainConfig(epochs=5, batch_size=4, early_stop=0.99)
    stats = train(_small_lm(), blocks, cfg, _ctx(tmp_path), evaluate=evaluate)
    assert stats.epochs == 2 and stats.stop_reason == "early_stop"
    assert len(calls) == 2
    per_epoch = 3 + 2
    assert stats.steps == 2 * per_epoch
    assert [e["accuracy"] for e in stats.eval_curve] == [0.5, 0.995]
    assert [e["epoch"] for e in stats.eval_curve] == [1, 2]
    assert [e["step"] for e in stats.eval_curve] == [per_epoch, 2 * per_epoch]


def test_evaluation_time_is_kept_out_of_the_training_time(tmp_path):
    def slow_evaluate():
        time.sleep(0.3)
        return 0.0

    cfg = TrainConfig(epochs=2, batch_size=4, early_stop=0.99)
    start = time.perf_counter()
    stats = train(_small_lm(), _toy_blocks(), cfg, _ctx(tmp_path), evaluate=slow_evaluate)
    wall = time.perf_counter() - start
    assert stats.eval_time_s >= 0.6
    assert stats.train_time_s + stats.eval_time_s <= wall
    assert stats.train_time_s < wall - 0.6


def test_train_runs_all_epochs_without_early_stop(tmp_path):
    cfg = TrainConfig(epochs=2, batch_size=4)
    stats = train(_small_lm(), _toy_blocks(), cfg, _ctx(tmp_path), evaluate=lambda: 1.0)
    assert stats.epochs == 2 and stats.stop_reason == "epochs" and stats.eval_curve == []
    assert stats.steps == 2 * 5 and math.isfinite(stats.final_loss)


def test_early_stop_needs_an_evaluation_and_a_positive_target(tmp_path):
    with pytest.raises(ValueError, match="early_stop"):
        train(_small_lm(), _toy_blocks(), TrainConfig(epochs=1, early_stop=0.9), _ctx(tmp_path))
    with pytest.raises(ValidationError):
        TrainConfig(early_stop=0.0)
    with pytest.raises(ValidationError):
        TrainConfig(early_stop=1.5)
    with pytest.raises(ValidationError, match="betas"):
        TrainConfig(betas=(0.9, 1.0))


def test_epoch_cosine_schedule_steps_per_epoch():
    cfg = TrainConfig(lr=1e-3, epochs=4, schedule="epoch_cosine")
    assert lr_at(0, 100, cfg, epoch=0) == lr_at(99, 100, cfg, epoch=0) == pytest.approx(1e-3)
    assert lr_at(50, 100, cfg, epoch=2) == pytest.approx(0.5e-3)
    assert lr_at(0, 100, cfg, epoch=1) == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi / 4)))
    warm = TrainConfig(lr=1e-3, warmup_frac=0.1)
    assert lr_at(0, 100, warm) == pytest.approx(1e-4) and lr_at(10, 100, warm) == pytest.approx(1e-3)


def test_decay_all_and_no_clipping(tmp_path):
    lm = _small_lm()
    x = torch.randint(0, 16, (4, 8), generator=torch.Generator().manual_seed(1))
    cfg = TrainConfig(epochs=1, batch_size=4, decay_all=True, grad_clip=None, betas=(0.9, 0.999))
    opt = _optimizer(lm, cfg)
    assert len(opt.param_groups) == 1 and opt.param_groups[0]["weight_decay"] == cfg.weight_decay
    assert opt.param_groups[0]["betas"] == (0.9, 0.999)
    assert sum(p.numel() for p in opt.param_groups[0]["params"]) == lm.num_parameters()
    opt_default = _optimizer(lm, TrainConfig())
    no_decay = [g for g in opt_default.param_groups if g["weight_decay"] == 0.0]
    assert any(p is lm.embed.weight for p in no_decay[0]["params"]), "default: embeddings not decayed"
    stats = train(lm, [(x, x.clone())], cfg, _ctx(tmp_path))
    assert stats.steps == 1


def test_mqar_run_stops_after_one_epoch(tmp_path):
    cfg = MQARConfig(
        vocab_size=64, batching="per_setting",
        train=[{"seq_len": 32, "num_kv_pairs": 4, "num_examples": 128}, {"seq_len": 16, "num_kv_pairs": 2, "num_examples": 64}],
        test=[{"seq_len": 32, "num_kv_pairs": 4, "num_examples": 64}, {"seq_len": 16, "num_kv_pairs": 2, "num_examples": 64}],
        model={"d_model": 32, "n_layers": 1, "mixer": {"num_heads": 2}},
        optim={"epochs": 4, "batch_size": 32, "lr": 1e-2, "early_stop": 1e-6},
    )
    result = MQAR().run(_ctx(tmp_path, "linear", cfg))
    m, d = result.metrics, result.details
    assert d["stop_reason"] == "early_stop"
    assert m["epochs_run"] == 1.0 and len(d["eval_curve"]) == 1
    assert m["train_steps"] == 4 + 2, "one epoch of per-setting batches"
    by = d["by_setting"]
    assert len(by) == 2
    assert m["accuracy"] == pytest.approx(np.mean([r["accuracy"] for r in by]))
    assert m["accuracy_pooled"] == pytest.approx(sum(r["hits"] for r in by) / sum(r["scored"] for r in by))
    assert m["accuracy_T32_kv4"] == by[0]["accuracy"] and m["accuracy_T16_kv2"] == by[1]["accuracy"]
    assert d["eval_curve"][0]["accuracy"] == pytest.approx(m["accuracy"]), "no training after the last eval"


@pytest.mark.parametrize("batching,lengths", [("per_setting", {32, 16}), ("padded", {32})])
def test_mqar_batching_modes_reach_the_model(tmp_path, monkeypatch, batching, lengths):
    seen = []
    original = MixerLM.loss

    def recording_loss(self, tokens, labels):
        seen.append(tokens.shape[1])
        return original(self, tokens, labels)

    monkeypatch.setattr(MixerLM, "loss", recording_loss)
    cfg = MQARConfig(
        vocab_size=64, batching=batching,
        train=[{"seq_len": 32, "num_kv_pairs": 4, "num_examples": 64}, {"seq_len": 16, "num_kv_pairs": 2, "num_examples": 64}],
        test=[{"seq_len": 32, "num_kv_pairs": 4, "num_examples": 16}],
        model={"d_model": 16, "n_layers": 1, "mixer": {"num_heads": 2}},
        optim={"epochs": 1, "batch_size": 32},
    )
    result = MQAR().run(_ctx(tmp_path, "linear", cfg))
    assert set(seen) == lengths
    assert len(seen) == 4 and result.metrics["train_steps"] == 4.0
    assert result.details["stop_reason"] == "epochs" and result.details["eval_curve"] == []


# -- 6. the zoology preset's model -------------------------------------------------------------


def _zoology(sets=()):
    return resolve_config(get_task("mqar"), "zoology", None, ["model.d_model=32", *sets])


def test_zoology_preset_resolves():
    cfg = _zoology()
    assert cfg.batching == "per_setting"
    assert cfg.model.norm == "layer" and cfg.model.state_mixer == "identity" and cfg.model.base_conv
    assert cfg.model.tie_embeddings and cfg.model.embed_dropout == 0.1 and cfg.model.init_std == 0.02
    assert cfg.model.position_embeddings == "none"
    o = cfg.optim
    assert o.betas == (0.9, 0.999) and o.decay_all and o.schedule == "epoch_cosine"
    assert o.grad_clip is None and o.early_stop == 0.99
    assert cfg.model.mixer_options("gdn")["expand_v"] == 2.0
    assert cfg.model.mixer_options("softmax") == {"num_heads": 2}


@pytest.mark.parametrize("mixer", ["gdn", "softmax"])
def test_zoology_model_shape(mixer):
    cfg = _zoology()
    longest = max(s.seq_len for s in [*cfg.train, *cfg.test])
    torch.manual_seed(0)
    lm = MixerLM(mixer, cfg.vocab_size, cfg.model, max_positions=longest)
    assert len(lm.blocks) == 2
    assert isinstance(lm.blocks[0].mixer, BaseConv)
    assert not isinstance(lm.blocks[1].mixer, BaseConv) and lm.blocks[1].mixer.d_model == 32
    for block in lm.blocks:
        assert not hasattr(block, "mlp") and block.state_mixer == "identity"
        assert isinstance(block.norm1, nn.LayerNorm) and isinstance(block.norm2, nn.LayerNorm)
    assert isinstance(lm.norm, nn.LayerNorm)
    assert not any(isinstance(m, nn.RMSNorm) and m is not getattr(lm.blocks[1].mixer, "o_norm", None)
                   for m in lm.modules())
    assert lm.head.weight is lm.embed.weight, "tied embeddings"
    assert abs(lm.embed.weight.std().item() - 0.02) < 0.001
    assert abs(lm.embed.weight.mean().item()) < 0.001
    for name, module in lm.named_modules():
        if isinstance(module, nn.Linear):
            assert abs(module.weight.std().item() - 0.02) < 0.3 * 0.02 or module.weight.numel() < 200, name
            if module.bias is not None:
                assert (module.bias == 0).all(), name
    assert isinstance(lm.embed_dropout, nn.Dropout) and lm.embed_dropout.p == 0.1
    assert not hasattr(lm, "pos_embed") and lm.max_positions == 0
    if mixer == "gdn":
        m = lm.blocks[1].mixer
        assert m.value_dim == 2 * m.head_dim == 32
        assert not hasattr(m, "g_proj") and isinstance(m.o_norm, nn.RMSNorm)
        assert m.v_proj.out_features == 2 * m.q_proj.out_features
    # the model runs, with dropout off in eval
    lm.eval()
    tokens = torch.randint(0, cfg.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    assert lm(tokens).shape == (2, 12, cfg.vocab_size)
    assert torch.equal(lm(tokens), lm(tokens))


@pytest.mark.parametrize("mixer", MIXERS)
def test_zoology_preset_builds_every_mixer(mixer):
    cfg = _zoology()
    validate_mixer_options(mixer, cfg)
    torch.manual_seed(0)
    lm = MixerLM(mixer, cfg.vocab_size, cfg.model).eval()
    layer = lm.blocks[1].mixer
    if mixer == "gla":
        assert layer.head_dim == 8 and not layer.config.short_conv, "keys half as wide, no short conv"
    if mixer in ("deltanet", "gdn", "mesa"):
        assert not layer.gated_output and layer.normed_output
    tokens = torch.randint(0, cfg.vocab_size, (1, 8), generator=torch.Generator().manual_seed(0))
    assert lm(tokens).shape == (1, 8, cfg.vocab_size)


def test_position_embeddings_for_attention_only():
    cfg = _zoology(["model.position_embeddings=attention"])
    soft = MixerLM("softmax", cfg.vocab_size, cfg.model, max_positions=16)
    gdn = MixerLM("gdn", cfg.vocab_size, cfg.model, max_positions=16)
    assert isinstance(soft.pos_embed, nn.Embedding) and soft.pos_embed.num_embeddings == 16
    assert soft.max_positions == 16
    assert not hasattr(gdn, "pos_embed") and gdn.max_positions == 0
    soft.eval()
    ok = torch.zeros(1, 16, dtype=torch.long)
    assert soft(ok).shape == (1, 16, cfg.vocab_size)
    with pytest.raises(ValueError, match="position"):
        soft(torch.zeros(1, 17, dtype=torch.long))
    gdn.eval()
    assert gdn(torch.zeros(1, 17, dtype=torch.long)).shape[1] == 17, "no table, no length limit"
    with pytest.raises(ValueError, match="max_positions"):
        MixerLM("softmax", cfg.vocab_size, cfg.model)
    # positions "all": every mixer gets a table
    all_cfg = cfg.model.model_copy(update={"position_embeddings": "all"})
    assert hasattr(MixerLM("gdn", 64, all_cfg, max_positions=8), "pos_embed")


def test_learned_positions_refuse_decode_steps():
    cfg = ModelConfig(d_model=16, n_layers=1, position_embeddings="attention", mixer={"num_heads": 2, "backend": "torch"})
    lm = MixerLM("softmax", 20, cfg, max_positions=8).eval()
    tokens = torch.randint(0, 20, (1, 4), generator=torch.Generator().manual_seed(0))
    logits, caches = prefill(lm, tokens)
    torch.testing.assert_close(logits, lm(tokens)[:, -1], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="position"):
        decode_step(lm, tokens[:, 0], caches)


# -- 7. decoding with BaseConv and the identity state mixer ------------------------------------


@pytest.mark.parametrize("prompt_len", [1, 2, 5])
def test_base_conv_identity_decoding_matches_forward(prompt_len):
    cfg = ModelConfig(d_model=16, n_layers=2, norm="layer", state_mixer="identity", base_conv=True,
                      tie_embeddings=True, embed_dropout=0.1, init_std=0.02,
                      mixer={"num_heads": 2, "backend": "torch"}, per_mixer={"gdn": {"output_gate": False, "expand_v": 2}})
    torch.manual_seed(0)
    lm = MixerLM("gdn", 24, cfg).eval()
    # larger weights than 0.02 so the layers actually change the logits
    with torch.no_grad():
        for p in lm.parameters():
            p.add_(0.2 * torch.randn_like(p))
    tokens = torch.randint(0, 24, (3, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = lm(tokens)
    logits, caches = prefill(lm, tokens[:, :prompt_len])
    steps = [logits]
    for t in range(prompt_len, tokens.shape[1]):
        logits, caches = decode_step(lm, tokens[:, t], caches)
        steps.append(logits)
    torch.testing.assert_close(torch.stack(steps, 1), full[:, prompt_len - 1 :], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kernel_size", [1, 2, 4])
def test_base_conv_step_matches_forward(kernel_size):
    torch.manual_seed(0)
    conv = BaseConv(8, kernel_size).double()
    x = torch.randn(2, 7, 8, dtype=torch.float64)
    full = conv(x)
    out, cache = conv.prefill(x[:, :2])
    torch.testing.assert_close(out, full[:, :2])
    assert cache.shape == (2, 8, kernel_size - 1)
    for t in range(2, 7):
        y, cache = conv.step(x[:, t], cache)
        torch.testing.assert_close(y, full[:, t])
    # from an empty cache
    y0, _ = conv.step(x[:, 0], None)
    torch.testing.assert_close(y0, full[:, 0])
    assert conv.state_size(100) == 8 * (kernel_size - 1)


def test_base_conv_is_causal():
    torch.manual_seed(0)
    conv = BaseConv(4, 3)
    x = torch.randn(1, 6, 4)
    x2 = x.clone()
    x2[:, 4:] += 1.0
    torch.testing.assert_close(conv(x)[:, :4], conv(x2)[:, :4])


def test_state_mixer_variants():
    x = torch.randn(2, 5, 16)
    for kind in ("mlp", "identity", "none"):
        lm = MixerLM("linear", 10, ModelConfig(d_model=16, n_layers=1, state_mixer=kind, norm="layer"))
        block = lm.blocks[0]
        assert hasattr(block, "mlp") == (kind == "mlp")
        expected = {"mlp": lambda v: v + block.mlp(block.norm2(v)), "identity": lambda v: v + block.norm2(v),
                    "none": lambda v: v}[kind](x)
        torch.testing.assert_close(block.finish(x), expected)


# -- 8. expand_k / expand_v / output_norm / output_gate ---------------------------------------


@pytest.mark.parametrize("mixer", MIXERS)
def test_expand_v_shapes_and_state(mixer):
    torch.manual_seed(0)
    x = torch.randn(2, 10, 32)
    sizes = []
    for ev in (1.0, 2.0):
        m = build_mixer(mixer, 32, {"num_heads": 2, "expand_v": ev, "backend": "torch"})
        assert m.head_dim == 16 and m.value_dim == int(16 * ev)
        assert m.v_proj.out_features == 2 * m.value_dim and m.o_proj.in_features == 2 * m.value_dim
        assert m(x).shape == (2, 10, 32)
        sizes.append(m.state_size(10))
    assert sizes[1] > sizes[0], "wider values, larger state"


@pytest.mark.parametrize("mixer", MIXERS)
def test_state_size_counts_the_decode_state(mixer):
    """op_state_size equals the floats of the op state a prefill really returns."""

    def floats(s):
        if isinstance(s, torch.Tensor):
            return s[0].numel()  # per sequence
        if isinstance(s, (tuple, list)):
            return sum(floats(t) for t in s)
        return 1 if isinstance(s, int) else 0  # e.g. a token count

    torch.manual_seed(0)
    for ev in (1.0, 2.0):
        m = build_mixer(mixer, 32, {"num_heads": 2, "expand_v": ev, "backend": "torch"})
        _, cache = m.prefill(torch.randn(1, 10, 32))
        assert floats(cache.state) == m.op_state_size(10), (mixer, ev)
        conv = floats(cache.conv)
        assert conv == m.state_size(10) - m.op_state_size(10), (mixer, ev)


@pytest.mark.parametrize("mixer", MIXERS)
def test_bad_expand_v_refused(mixer):
    with pytest.raises(ValueError, match="expand_v"):
        build_mixer(mixer, 32, {"num_heads": 2, "expand_v": 0.3})  # 16 * 0.3 = 4.8
    with pytest.raises(ValueError, match="expand_v"):
        build_mixer(mixer, 32, {"num_heads": 2, "expand_v": 0.01})  # 0.16 rounds to 0


@pytest.mark.parametrize("mixer", MIXERS)
def test_expand_k_sets_head_dim(mixer):
    m = build_mixer(mixer, 32, {"num_heads": 2, "expand_k": 0.5, "backend": "torch"})
    assert m.head_dim == 8 and m.value_dim == 8
    assert m.q_proj.out_features == m.k_proj.out_features == 16
    assert m(torch.randn(1, 6, 32)).shape == (1, 6, 32)
    explicit = build_mixer(mixer, 32, {"num_heads": 2, "expand_k": 0.5, "head_dim": 12})
    assert explicit.head_dim == 12, "head_dim, when set, wins over expand_k"
    with pytest.raises(ValueError, match="expand_k"):
        build_mixer(mixer, 32, {"num_heads": 2, "expand_k": 0.01})


@pytest.mark.parametrize("mixer", MIXERS)
@pytest.mark.parametrize("gate,norm", [(None, None), (True, None), (False, None), (False, True), (True, False), (False, False)])
def test_output_gate_and_norm_combinations(mixer, gate, norm):
    opts = {"num_heads": 2, "backend": "torch", "expand_v": 2.0}
    if gate is not None:
        opts["output_gate"] = gate
    if norm is not None:
        opts["output_norm"] = norm
    torch.manual_seed(0)
    m = build_mixer(mixer, 32, opts)
    want_gate = type(m).output_gate if gate is None else gate
    want_norm = want_gate if norm is None else norm
    assert m.gated_output == want_gate and hasattr(m, "g_proj") == want_gate
    assert m.normed_output == want_norm and hasattr(m, "o_norm") == want_norm
    if want_gate:
        assert m.g_proj.out_features == 2 * m.value_dim
    if want_norm:
        assert m.o_norm.weight.shape == (m.value_dim,)
    x = torch.randn(2, 7, 32)
    y = m(x)
    assert y.shape == (2, 7, 32) and torch.isfinite(y).all()
    # the output stage does what the flags say
    o = torch.randn(2, 7, 2, m.value_dim)
    ref = o
    if want_norm:
        ref = m.o_norm(ref)
    if want_gate:
        ref = ref * torch.nn.functional.silu(m.g_proj(x).unflatten(-1, (2, m.value_dim)))
    torch.testing.assert_close(m._output(o, x), m.o_proj(ref.flatten(-2)))


def test_output_norm_without_gate_normalises():
    m = build_mixer("gdn", 32, {"num_heads": 2, "output_gate": False, "output_norm": True})
    o = 5 * torch.randn(1, 3, 2, 16)
    normed = m.o_norm(o)
    rms = normed.pow(2).mean(-1).sqrt()
    torch.testing.assert_close(rms, torch.ones_like(rms), rtol=1e-3, atol=1e-3)


# -- 9. per_mixer ------------------------------------------------------------------------------


def test_per_mixer_unknown_name_refused():
    with pytest.raises(ValidationError, match="gdnn"):
        ModelConfig(per_mixer={"gdnn": {"expand_v": 2.0}})
    with pytest.raises(ConfigError, match="gdnn"):
        resolve_config(get_task("mqar"), "tiny", None, ["model.per_mixer={gdnn: {expand_v: 2}}"])


def test_per_mixer_options_override_mixer_options():
    cfg = ModelConfig(mixer={"num_heads": 2, "expand_v": 1.0}, per_mixer={"gdn": {"expand_v": 2.0}})
    assert cfg.mixer_options("gdn") == {"num_heads": 2, "expand_v": 2.0}
    assert cfg.mixer_options("deltanet") == {"num_heads": 2, "expand_v": 1.0}
    lm_gdn = MixerLM("gdn", 16, cfg.model_copy(update={"d_model": 16}))
    lm_dn = MixerLM("deltanet", 16, cfg.model_copy(update={"d_model": 16}))
    assert lm_gdn.blocks[0].mixer.value_dim == 16 and lm_dn.blocks[0].mixer.value_dim == 8


def test_validate_mixer_options_reports_bad_per_mixer_option():
    cfg = resolve_config(get_task("mqar"), "tiny", None, ["model.per_mixer={gdn: {expand_v: -1}}"])
    validate_mixer_options("deltanet", cfg)  # other mixers are unaffected
    with pytest.raises(ConfigError, match=r"per_mixer\.gdn.*expand_v"):
        validate_mixer_options("gdn", cfg)
    cfg = resolve_config(get_task("mqar"), "tiny", None, ["model.per_mixer={gla: {bogus_option: 1}}"])
    with pytest.raises(ConfigError, match="bogus_option"):
        validate_mixer_options("gla", cfg)
    # MixerLM itself refuses it too
    with pytest.raises(ValidationError, match="bogus_option"):
        MixerLM("gla", cfg.vocab_size, cfg.model)


def test_a_nan_weight_is_reported_as_divergence_not_as_an_op_error(tmp_path):
    model = MixerLM("gdn", 64, ModelConfig(d_model=16, n_layers=1, mixer={"num_heads": 2}))
    with torch.no_grad():
        model.blocks[0].mixer.a_proj.weight.fill_(float("nan"))
    with pytest.raises(TrainingDiverged, match="a_proj"):
        train(model, _toy_blocks(), TrainConfig(epochs=1, batch_size=4), _ctx(tmp_path))


def test_matmul_precision_holds_in_training_and_evaluation_and_is_restored(tmp_path):
    seen = []
    before = torch.get_float32_matmul_precision()
    cfg = TrainConfig(epochs=2, batch_size=4, early_stop=0.99, matmul_precision="high")
    train(_small_lm(), _toy_blocks(), cfg, _ctx(tmp_path),
          evaluate=lambda: seen.append(torch.get_float32_matmul_precision()) or 0.0)
    assert seen == ["high", "high"]
    assert torch.get_float32_matmul_precision() == before


def test_matmul_precision_refuses_unknown_values():
    with pytest.raises(ValueError, match="matmul_precision"):
        TrainConfig(matmul_precision="medium")
