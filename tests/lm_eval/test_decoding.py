"""Incremental decoding (prefill + step across blocks) against full forward passes."""

import pytest
import torch

from mixers import mixer_names
from tasks.common.decoding import decode_step, greedy_decode, prefill
from tests.lm_eval.conftest import small_model
from tests.util import rel_err


@pytest.mark.parametrize("mixer", mixer_names())
def test_prefill_then_steps_match_forward(mixer):
    model = small_model(mixer, 50).double()
    tokens = torch.randint(0, 50, (3, 11), generator=torch.Generator().manual_seed(2))
    full = model(tokens)  # [B, T, V]
    logits, caches = prefill(model, tokens[:, :4])
    steps = [logits]
    for t in range(4, tokens.shape[1]):
        logits, caches = decode_step(model, tokens[:, t], caches)
        steps.append(logits)
    assert rel_err(torch.stack(steps, 1), full[:, 3:]) < 1e-10


def test_prefill_of_one_token():
    model = small_model("gdn", 20).double()
    tokens = torch.tensor([[5], [7]])
    logits, caches = prefill(model, tokens)
    assert rel_err(logits, model(tokens)[:, -1]) < 1e-10
    assert len(caches) == len(model.blocks)


def _greedy_by_forward(model, prompt, n):
    tokens = prompt.clone()
    for _ in range(n):
        tokens = torch.cat([tokens, model(tokens)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return tokens[:, prompt.shape[1] :].tolist()


@pytest.mark.parametrize("mixer", ["gdn", "softmax", "linear"])
def test_greedy_decode_matches_full_forward_greedy(mixer):
    model = small_model(mixer, 30).double()
    prompt = torch.randint(0, 30, (2, 6), generator=torch.Generator().manual_seed(3))
    assert greedy_decode(model, prompt, 9) == _greedy_by_forward(model, prompt, 9)


def test_greedy_decode_stops_per_row():
    model = small_model("gdn", 30).double()
    prompt = torch.randint(0, 30, (2, 5), generator=torch.Generator().manual_seed(4))
    ref = _greedy_by_forward(model, prompt, 8)
    out = greedy_decode(model, prompt, 8, lambda row, ids: row == 0 and len(ids) == 3)
    assert out == [ref[0][:3], ref[1]]
    assert greedy_decode(model, prompt, 0) == [[], []]


def test_bad_inputs_name_the_problem():
    model = small_model("gdn", 30)
    with pytest.raises(ValueError, match=r"tokens must be \[B, T\]"):
        prefill(model, torch.zeros(3, dtype=torch.long))
    _, caches = prefill(model, torch.zeros(1, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="caches holds 1 entries"):
        decode_step(model, torch.zeros(1, dtype=torch.long), caches[:1])
    with pytest.raises(ValueError, match="max_new_tokens"):
        greedy_decode(model, torch.zeros(1, 2, dtype=torch.long), -1)
