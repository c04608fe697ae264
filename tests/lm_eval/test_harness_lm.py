"""The lm-eval model `harness`: its three methods against direct model calls."""

import math

import pytest
import torch

from tasks.lm_data import ByteTokenizer, IdTokenizer

pytest.importorskip("lm_eval")
from lm_eval.api.instance import Instance  # noqa: E402

from tasks.common.checkpoint import load_checkpoint  # noqa: E402
from tasks.lm_eval_bridge.model import HarnessLM  # noqa: E402


def _requests(kind, args_list):
    return [Instance(request_type=kind, doc={}, arguments=args, idx=i) for i, args in enumerate(args_list)]


@torch.no_grad()
def _direct_logprob(model, context, continuation):
    """Sum of log-softmax of the logits at the continuation's positions, and its greediness."""
    tokens = torch.tensor([context + continuation])
    logprobs = model(tokens[:, :-1])[0].double().log_softmax(-1)
    positions = range(len(context) - 1, len(context) + len(continuation) - 1)
    picked = [logprobs[p, t].item() for p, t in zip(positions, continuation)]
    greedy = all(logprobs[p].argmax().item() == t for p, t in zip(positions, continuation))
    return sum(picked), greedy


def test_loglikelihood_bytes_matches_direct(byte_checkpoint):
    lm = HarnessLM(str(byte_checkpoint), batch_size=3)
    model, tok = lm.model, ByteTokenizer()
    pairs = [("After Monday comes", " Tuesday"), ("", "hello"), ("a", " b"), ("The sky is", " blue."), ("x" * 30, "yz")]
    got = lm.loglikelihood(_requests("loglikelihood", pairs))
    for (ctx, cont), (logprob, greedy) in zip(pairs, got):
        want, want_greedy = _direct_logprob(model, [tok.bos_id, *tok.encode(ctx)], tok.encode(cont))
        assert logprob == pytest.approx(want, rel=1e-5, abs=1e-4)
        assert greedy == want_greedy


def test_loglikelihood_greedy_flag_and_truncation(ids_checkpoint):
    lm = HarnessLM(str(ids_checkpoint), batch_size=2, max_length=6)
    model = lm.model
    context = [3, 1, 4, 1, 5, 9, 2, 6]
    with torch.no_grad():
        best = model(torch.tensor([context[-6:]]))[0, -1].argmax().item()
    pairs = [(" ".join(map(str, context)), f" {best}"), ("7 7", " 8 9")]
    (lp0, greedy0), (lp1, _) = lm.loglikelihood(_requests("loglikelihood", pairs))
    # Only the last max_length + 1 tokens of context + continuation are kept.
    assert greedy0 and lp0 == pytest.approx(_direct_logprob(model, context[-6:], [best])[0], rel=1e-5)
    assert lp1 == pytest.approx(_direct_logprob(model, [7, 7], [8, 9])[0], rel=1e-5)


def test_loglikelihood_rolling_matches_direct_windows(byte_checkpoint):
    window = 8
    lm = HarnessLM(str(byte_checkpoint), batch_size=4, max_length=window)
    texts = ["abc", "exactly8", "a longer text of 29 bytes ok."]
    got = lm.loglikelihood_rolling(_requests("loglikelihood_rolling", [(t,) for t in texts]))
    tok = ByteTokenizer()
    for text, total in zip(texts, got):
        tokens = tok.encode(text)
        stream = [tok.bos_id, *tokens]  # stream[i + 1] is token i, predicted from stream[: i + 1]
        want = 0.0
        for start in range(0, len(tokens), window):  # each token predicted once, at most `window` inputs
            end = min(start + window, len(tokens))
            inputs = stream[max(0, end - window) : end]  # predicts stream[max(0, end - window) + 1 : end + 1]
            with torch.no_grad():
                logprobs = lm.model(torch.tensor([inputs]))[0].double().log_softmax(-1)
            positions = range(len(inputs) - (end - start), len(inputs))
            want += sum(logprobs[p, t].item() for p, t in zip(positions, tokens[start:end]))
        assert total == pytest.approx(want, rel=1e-5)


def _greedy_text_by_forward(model, tokens, n, tok):
    out = []
    with torch.no_grad():
        for _ in range(n):
            nxt = model(torch.tensor([tokens + out]))[0, -1].argmax().item()
            out.append(nxt)
    return tok.decode(out), out


def test_generate_until_matches_forward_greedy_ids(ids_checkpoint):
    lm = HarnessLM(str(ids_checkpoint), batch_size=4)
    tok = IdTokenizer(40)
    prompts = ["1 2 3 4", "5 6 7 8", "9 9 9", "10"]
    refs = [_greedy_text_by_forward(lm.model, tok.encode(p), 12, tok)[0] for p in prompts]
    # Stop strings taken from the reference so that each request stops at a known place.
    stop0 = refs[0][len(refs[0]) // 2 :][:4]
    args = [(prompts[0], {"until": [stop0], "max_gen_toks": 12}),
            (prompts[1], {"until": "\n", "max_gen_toks": 5}),
            (prompts[2], {"until": [], "max_gen_toks": 12}),
            (prompts[3], {"until": [refs[3][:1]]})]
    got = lm.generate_until(_requests("generate_until", args))
    assert got[0] == refs[0][: refs[0].index(stop0)]
    assert got[1] == _greedy_text_by_forward(lm.model, tok.encode(prompts[1]), 5, tok)[0]
    assert got[2] == refs[2]
    assert got[3] == ""


def test_generate_until_bytes_stops_at_until_or_bos(byte_checkpoint):
    lm = HarnessLM(str(byte_checkpoint), batch_size=2, max_gen_toks=10)
    tok = ByteTokenizer()
    context = [tok.bos_id, *tok.encode("After Monday comes")]
    text, ids = _greedy_text_by_forward(lm.model, context, 10, tok)
    if tok.bos_id in ids:
        text = tok.decode(ids[: ids.index(tok.bos_id)])
    (got,) = lm.generate_until(_requests("generate_until", [("After Monday comes", {"until": ["\u0000never"]})]))
    assert got == text
    with pytest.raises(ValueError, match="greedily only"):
        lm.generate_until(_requests("generate_until", [("x", {"do_sample": True, "temperature": 0.7})]))


def test_wrapper_from_loaded_checkpoint_and_model_info(ids_checkpoint):
    lm = HarnessLM(load_checkpoint(ids_checkpoint), batch_size="auto")
    assert lm.batch_size == 16 and lm.max_length == 64
    info = lm.get_model_info()
    assert info["mixer"] == "softmax" and info["tokenizer"]["kind"] == "ids"
    with pytest.raises(ValueError, match="'hello' is not a token id"):
        lm.loglikelihood(_requests("loglikelihood", [("hello", " 3")]))
    assert math.isfinite(lm.loglikelihood(_requests("loglikelihood", [("", " 3")]))[0][0])
