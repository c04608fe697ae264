"""The fidelity maths on cases with known answers, the op wrappers against the formulas of
docs/design.md §7, the mixer mapping, and a tiny end-to-end run of the task."""

import json

import numpy as np
import pytest
import torch

from tasks.base import RunContext
from tasks.fidelity import FAMILIES, Fidelity, FidelityConfig, check_mixer
from tasks.fidelity_math import (
    OPS,
    balance_factor,
    diag_rnn_attention,
    exact_diagonal,
    first_order_diagonal,
    gaussian_qkv,
    prefix_rel_err,
    softmax_op,
    weights_from_diagonal,
)
from tasks.fidelity_swap import swapped_model
from tests.util import rel_err

B, T, H, D = 2, 37, 3, 8
TOL64 = 1e-10


def _qkv(logit_std=1.0, seed=0, T=T):
    return gaussian_qkv(B, T, H, D, logit_std, torch.Generator().manual_seed(seed))


def _softmax(q, k, v, scale):
    """Explicit causal softmax, fp64: o [B, T, H, V]."""
    logits = torch.einsum("bthd,bshd->bhts", q * scale, k)
    n = q.shape[1]
    logits = logits.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    return torch.einsum("bhts,bshv->bthv", logits.softmax(-1), v)


def _running_mean(v):
    n = v.shape[1]
    return v.cumsum(1) / torch.arange(1, n + 1, dtype=v.dtype).view(1, n, 1, 1)


# -- the quadratic "exact RNN" form -------------------------------------------------------

def test_exact_diagonal_reproduces_softmax():
    """With the exact a_jj the unrolled RNN is softmax attention itself (seed 000)."""
    q, k, v = _qkv(logit_std=3.0)
    weights = weights_from_diagonal(exact_diagonal(q, k, scale=1.0))
    o = torch.einsum("bhts,bshv->bthv", weights, v)
    assert rel_err(o, _softmax(q, k, v, 1.0)) < TOL64


def test_diag_rnn_matches_the_recursion_run_per_query():
    q, k, v = _qkv(logit_std=2.0)
    scale = 0.7
    diag = first_order_diagonal(q, k, scale)
    expected = torch.empty_like(v)
    for s in range(T):  # o_j = o_{j-1} + D[s, j] (v_j - o_{j-1}) for j = 1..s, per query s
        o = torch.zeros(B, H, D, dtype=torch.float64)
        for j in range(s + 1):
            o = o + diag[:, :, s, j, None] * (v[:, j] - o)
        expected[:, s] = o
    for block in (5, 256):
        assert rel_err(diag_rnn_attention(q, k, v, scale, row_block=block), expected) < TOL64


def test_first_order_diagonal_formula():
    q, k, _ = _qkv()
    diag = first_order_diagonal(q, k, scale=0.5)
    s, j = 20, 9  # 0-based: key j+1 of query s+1
    kbar = k[:, : j + 1].mean(1)
    expected = (1 + torch.einsum("bhd,bhd->bh", 0.5 * q[:, s], k[:, j] - kbar)) / (j + 1)
    torch.testing.assert_close(diag[:, :, s, j], expected)
    assert (diag[:, :, 0, 0] == 1).all(), "a_11 = 1: the first key takes all weight"
    assert (diag.triu(1) == 0).all()


# -- known answers of every form ------------------------------------------------------------

FORMS = ["lin_gdn", "vala", "diag_rnn", "lin_gdn_bal"]


@pytest.mark.parametrize("op", ["softmax", *FORMS, "linear_elu1"])
def test_all_keys_equal_gives_the_running_mean(op):
    q, _, v = _qkv(logit_std=2.0)
    k = torch.randn(1, 1, H, D, dtype=torch.float64).expand(B, T, H, D).contiguous()
    o = softmax_op(q, k, v, None, "reference") if op == "softmax" else OPS[op](q, k, v, None, "reference")
    assert rel_err(o, _running_mean(v)) < TOL64


@pytest.mark.parametrize("op", ["softmax", *FORMS])
def test_zero_query_gives_uniform_weights(op):
    _, k, v = _qkv(logit_std=2.0)
    q = torch.zeros_like(k)
    o = softmax_op(q, k, v, None, "reference") if op == "softmax" else OPS[op](q, k, v, None, "reference")
    assert rel_err(o, _running_mean(v)) < TOL64


@pytest.mark.parametrize("op", ["softmax", *FORMS, "linear_elu1"])
def test_single_token_returns_its_value(op):
    q, k, v = _qkv(logit_std=4.0, T=1)
    o = softmax_op(q, k, v, None, "reference") if op == "softmax" else OPS[op](q, k, v, None, "reference")
    assert rel_err(o, v) < TOL64


def test_linear_raw_is_the_unnormalised_sum():
    q, k, v = _qkv()
    weights = torch.einsum("bthd,bshd->bhts", q * 0.3, k).tril()
    expected = torch.einsum("bhts,bshv->bthv", weights, v)
    assert rel_err(OPS["linear_raw"](q, k, v, 0.3, "reference"), expected) < TOL64


def test_vala_is_the_first_order_expansion_of_every_weight():
    """VaLA: a_ti ~ (1/t)(1 + q'_t.(k_i - kbar_t)), the expansion of softmax around uniform."""
    q, k, v = _qkv(logit_std=1.5)
    scale = 0.8
    n = torch.arange(1, T + 1, dtype=torch.float64).view(1, T, 1, 1)
    kbar = k.cumsum(1) / n  # [B, t, H, D]
    centred = torch.einsum("bthd,bshd->bhts", scale * q, k) - torch.einsum("bthd,bthd->bht", scale * q, kbar)[..., None]
    weights = ((1 + centred) / n.view(1, 1, T, 1)).tril()
    expected = torch.einsum("bhts,bshv->bthv", weights, v)
    for backend in ("reference", "torch"):
        assert rel_err(OPS["vala"](q, k, v, scale, backend), expected) < TOL64


def test_lin_gdn_is_the_design_recursion():
    """docs/design.md §7: h_t = ((1-1/t) I - (1/t) u u^T) h + (1/t) u w^T, o_t = h_t^T q'_t + vbar_t."""
    q, k, v = _qkv(logit_std=1.0)
    scale = 0.9
    h = torch.zeros(B, H, D, D, dtype=torch.float64)
    ksum, vsum = torch.zeros(B, H, D, dtype=torch.float64), torch.zeros(B, H, D, dtype=torch.float64)
    expected = torch.empty_like(v)
    for t in range(1, T + 1):
        vbar_prev = vsum / max(t - 1, 1)
        ksum, vsum = ksum + k[:, t - 1], vsum + v[:, t - 1]
        u, w = k[:, t - 1] - ksum / t, v[:, t - 1] - vbar_prev
        h = (1 - 1 / t) * h - torch.einsum("bhk,bhj,bhjv->bhkv", u, u, h) / t + torch.einsum("bhk,bhv->bhkv", u, w) / t
        expected[:, t - 1] = torch.einsum("bhk,bhkv->bhv", scale * q[:, t - 1], h) + vsum / t
    for backend in ("reference", "torch"):
        assert rel_err(OPS["lin_gdn"](q, k, v, scale, backend), expected) < TOL64


@pytest.mark.parametrize("op", FORMS[:3])
def test_error_is_second_order_in_the_logit_scale(op):
    """All three forms are exact to first order in (q', k) around uniform attention, so
    halving the logit std cuts the error about 4x once the scale is small."""
    errors = []
    for std in (0.02, 0.01):
        q, k, v = _qkv(logit_std=std, seed=3)
        errors.append(rel_err(OPS[op](q, k, v, 1.0, "reference"), _softmax(q, k, v, 1.0)))
    assert 3.5 < errors[0] / errors[1] < 4.5, errors


def test_balancing_keeps_the_logit_invariant_forms_and_equalises_norms():
    q, k, v = _qkv(logit_std=1.0)
    k = k * 5.0  # ||k|| >> ||q'||, as in trained models
    c = balance_factor(q, k, scale=0.5)
    assert c.shape == (H,) and (c > 1).all()
    qb, kb = q * c.view(1, 1, -1, 1), k / c.view(1, 1, -1, 1)
    np.testing.assert_allclose(balance_factor(qb, kb, scale=0.5).numpy(), 1.0, rtol=1e-12)
    for op in ("vala", "diag_rnn"):
        assert rel_err(OPS[op](qb, kb, v, 0.5, "reference"), OPS[op](q, k, v, 0.5, "reference")) < TOL64
    assert rel_err(OPS["lin_gdn_bal"](q, k, v, 0.5, "reference"), OPS["lin_gdn"](qb, kb, v, 0.5, "reference")) < TOL64


# -- the metric and the inputs --------------------------------------------------------------

def test_prefix_rel_err_is_the_error_of_each_shorter_sequence():
    q, _, v = _qkv()
    out, ref = v + 0.1 * q, v
    curve = prefix_rel_err(out, ref)
    for t in (1, 5, T):
        assert curve[t - 1].item() == pytest.approx(rel_err(out[:, :t], ref[:, :t]), rel=1e-12)


def test_gaussian_logits_have_the_requested_std():
    q, k, _ = gaussian_qkv(8, 64, 2, 32, 2.0, torch.Generator().manual_seed(0))
    logits = torch.einsum("bthd,bshd->bhts", q, k)
    assert logits.std().item() == pytest.approx(2.0, rel=0.05)
    assert q.norm(dim=-1).mean().item() == pytest.approx(k.norm(dim=-1).mean().item(), rel=0.05)


# -- the mixer mapping and the task ----------------------------------------------------------

@pytest.mark.parametrize("mixer", ["softmax", "gla", "deltanet", "gdn", "mesa"])
def test_mixers_without_a_gate_free_op_are_refused(mixer):
    with pytest.raises(ValueError, match="Valid mixers: lin_gdn, linear"):
        check_mixer(mixer)


def test_every_swap_loads_the_softmax_weights():
    from tasks.common.model import MixerLM, ModelConfig

    model_cfg = ModelConfig(d_model=16, n_layers=1, mixer={"num_heads": 2})
    softmax = MixerLM("softmax", 32, model_cfg)
    tokens = torch.randint(0, 32, (2, 12))
    balance = [torch.tensor([2.0, 0.5])]
    for family in FAMILIES.values():
        assert set(family.swaps) == set(family.ops)
        for op, swap in family.swaps.items():
            swapped = swapped_model(softmax, swap, balance)  # load_state_dict(strict=True) inside
            assert torch.isfinite(swapped(tokens)).all(), op
    assert softmax(tokens).shape == (2, 12, 32), "the original model is left as it was"


def test_tiny_run_end_to_end(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path / "cache"))
    cfg = FidelityConfig(**Fidelity.presets["tiny"])
    ctx = RunContext(mixer="lin_gdn", config=cfg, device=torch.device("cpu"), seed=0, artifact_dir=tmp_path / "art")
    result = Fidelity().run(ctx)
    m = result.metrics
    assert m["rel_err"] == m["rel_err_lin_gdn_trained"]
    for op in FAMILIES["lin_gdn"].ops:
        assert np.isfinite(m[f"rel_err_{op}_trained"]) and 0 <= m[f"swap_accuracy_{op}"] <= 1
        assert f"rel_err_{op}_std0p5" in m and f"rel_err_{op}_std2" in m
    assert 0 <= m["softmax_accuracy"] <= 1
    assert len(result.details["gaussian"]) == len(FAMILIES["lin_gdn"].ops) * 2 * 2
    assert (tmp_path / "art" / result.artifacts[0]).stat().st_size > 1000
    json.dumps(result.details)
