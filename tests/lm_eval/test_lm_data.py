"""Tokenizers, corpus loading and splits, training windows, checkpoints."""

import numpy as np
import pytest
import torch

from tasks.common.checkpoint import load_checkpoint, resolve_checkpoint_path, save_checkpoint
from tasks.lm_corpus import cloze_items, tiny_corpus
from tasks.lm_data import (
    SHIPPED_CORPUS,
    ByteTokenizer,
    IdTokenizer,
    corpus_files,
    load_documents,
    split_documents,
    token_stream,
    tokenizer_from_info,
    windows,
)
from tests.lm_eval.conftest import small_model


def test_byte_tokenizer_roundtrip_and_specials():
    tok = ByteTokenizer()
    text = "naïve café, 3 + 4 = 7\n"
    ids = tok.encode(text)
    assert max(ids) < 256 and tok.decode(ids) == text
    assert tok.decode([tok.bos_id, *ids, tok.bos_id]) == text
    assert tokenizer_from_info(tok.info()).vocab_size == 257


def test_id_tokenizer_roundtrip_and_errors():
    tok = IdTokenizer(100)
    assert tok.encode(" 3 17  99\n") == [3, 17, 99]
    assert "3 17" + tok.decode([5, 6]) == "3 17 5 6"
    with pytest.raises(ValueError, match="'cat' is not a token id"):
        tok.encode("3 cat")
    with pytest.raises(ValueError, match=r"outside this model's vocabulary \[0, 100\)"):
        tok.encode("100")
    with pytest.raises(ValueError, match="unknown tokenizer kind 'bpe'"):
        tokenizer_from_info({"kind": "bpe"})


def test_shipped_corpus_is_the_generator_output():
    assert SHIPPED_CORPUS.read_text() == tiny_corpus()
    assert 100_000 < SHIPPED_CORPUS.stat().st_size < 400_000


def test_cloze_items_are_facts_of_the_corpus():
    text = tiny_corpus()
    items = cloze_items()
    assert len(items) > 100
    for item in items:
        assert len(set(item["choices"])) == 4 and 0 <= item["label"] < 4
        if item["kind"] in ("days", "colours", "sounds", "homes", "opposites"):
            assert f"{item['context']} {item['choices'][item['label']]}" in text, item


def test_corpus_folder_paragraphs_and_stable_split(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "b.txt").write_text("first para\n\n\nsecond para\n")
    (tmp_path / "sub" / "a.md").write_text("third\n  \nfourth")
    (tmp_path / "skip.bin").write_text("not text")
    assert [p.name for p in corpus_files(tmp_path)] == ["b.txt", "a.md"]
    assert load_documents(tmp_path) == ["first para", "second para", "third", "fourth"]
    docs = load_documents(None)
    train, val = split_documents(docs, 0.05)
    assert 0.03 < len(val) / len(docs) < 0.07 and not set(train) & set(val)
    assert split_documents(list(reversed(docs)), 0.05)[1] == list(reversed(val))


def test_corpus_errors(tmp_path):
    with pytest.raises(ValueError, match="neither a file nor a folder"):
        corpus_files(tmp_path / "missing.txt")
    with pytest.raises(ValueError, match="holds no .txt/.md files"):
        corpus_files(tmp_path)
    with pytest.raises(ValueError, match="both must be non-empty"):
        split_documents(["only one paragraph"], 0.5)


def test_windows_cover_the_stream():
    stream = token_stream(["ab", "c"], ByteTokenizer())
    assert stream.tolist() == [256, 97, 98, 256, 99]
    x, y = windows(stream, 3)
    assert x.tolist() == [[256, 97, 98], [256, 99, 0]]
    assert y.tolist() == [[97, 98, 256], [99, -100, -100]]
    x, y = windows(np.arange(10), 3, max_windows=2)
    assert x.shape == (2, 3) and y[1].tolist() == [4, 5, 6]


def test_checkpoint_roundtrip(tmp_path):
    model = small_model("deltanet", 60)
    path = save_checkpoint(tmp_path / "run" / "checkpoint", model, IdTokenizer(60).info(), {"task": "mqar", "seed": 3})
    (tmp_path / "run.json").write_text("{}")
    for where in (path, tmp_path / "run", tmp_path / "run.json"):
        ckpt = load_checkpoint(where)
        assert ckpt.mixer == "deltanet" and ckpt.meta == {"task": "mqar", "seed": 3} and ckpt.tokenizer["kind"] == "ids"
        tokens = torch.randint(0, 60, (2, 9))
        assert torch.equal(ckpt.model(tokens), model(tokens))
        assert not ckpt.model.training


def test_checkpoint_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        resolve_checkpoint_path(tmp_path / "nope.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="cannot be read as a harness checkpoint"):
        load_checkpoint(tmp_path / "junk.pt")
    torch.save({"format": "other"}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="has format 'other'"):
        load_checkpoint(tmp_path / "other.pt")
