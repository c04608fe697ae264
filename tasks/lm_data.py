"""Text for the `lm` task: tokenizers, corpus loading, the validation split, training windows.

Two tokenizers, both needing no download, described by a small JSON-able `info()` dict that
checkpoints carry (`tokenizer_from_info` rebuilds one):
- `ByteTokenizer`: UTF-8 bytes 0-255 plus BOS = 256, which starts every document (so it
  also marks where a document ends). The `lm` task trains with it.
- `IdTokenizer`: text of space-separated integer token ids ("3 17 250"), the rendering of
  MQAR/NIAH sequences as text, for models trained on ids (vocab_size ids, no BOS).

A corpus is a text file or a folder of them (*.txt, *.md, read recursively in name order);
its documents are the paragraphs (text between blank lines). A document belongs to the
validation split by a stable hash of its text, so the split does not depend on the seed
or on the order of files, and duplicated paragraphs never straddle the split.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from tasks.lm_corpus import CORPUS_VERSION, tiny_corpus

# The shipped default corpus (data/tiny_corpus.txt is `tiny_corpus()` written out).
SHIPPED_CORPUS = Path(__file__).resolve().parent.parent / "data" / "tiny_corpus.txt"
CORPUS_SUFFIXES = (".txt", ".md")


class Tokenizer(Protocol):
    """What the LM task and the lm-eval bridge need from a tokenizer."""

    vocab_size: int
    bos_id: int | None  # prepended to every context when add_bos
    add_bos: bool
    prefix_id: int  # stands for an empty context (lm-eval's rolling loglikelihood)

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...
    def info(self) -> dict[str, Any]: ...


class ByteTokenizer:
    """UTF-8 bytes as tokens 0-255, BOS = 256 (document start); vocabulary 257."""

    vocab_size = 257
    bos_id = 256
    add_bos = True
    prefix_id = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        """Bytes to text; special tokens are dropped, broken UTF-8 becomes U+FFFD."""
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def info(self) -> dict[str, Any]:
        return {"kind": "bytes", "vocab_size": self.vocab_size}


class IdTokenizer:
    """Space-separated integer token ids 0..vocab_size-1 as text; no BOS.

    An empty context is represented by token 0 (`prefix_id`): these models were never
    trained on a document start, so any fixed token is as good as another."""

    bos_id = None
    add_bos = False
    prefix_id = 0

    def __init__(self, vocab_size: int):
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        ids = []
        for word in text.split():
            if not re.fullmatch(r"\d+", word):
                raise ValueError(
                    f"text {_preview(text)!r}: {word!r} is not a token id; this model reads space-separated "
                    f"integer ids in [0, {self.vocab_size}) (tokenizer 'ids'), e.g. the harness_mqar task"
                )
            value = int(word)
            if value >= self.vocab_size:
                raise ValueError(
                    f"token id {value} in {_preview(text)!r} is outside this model's vocabulary [0, {self.vocab_size})")
            ids.append(value)
        return ids

    def decode(self, ids: list[int]) -> str:
        """Each token as ' <id>', so decode(ids) continues a prompt written by encode's inverse."""
        return "".join(f" {i}" for i in ids)

    def info(self) -> dict[str, Any]:
        return {"kind": "ids", "vocab_size": self.vocab_size}


def _preview(text: str, width: int = 40) -> str:
    return text if len(text) <= width else text[:width] + "..."


def tokenizer_from_info(info: dict[str, Any]) -> ByteTokenizer | IdTokenizer:
    """Rebuild a tokenizer from its `info()` (as stored in a checkpoint)."""
    kind = info.get("kind")
    if kind == "bytes":
        return ByteTokenizer()
    if kind == "ids":
        return IdTokenizer(int(info["vocab_size"]))
    raise ValueError(f"unknown tokenizer kind {kind!r} in {info}; valid kinds: bytes, ids")


def default_corpus_path() -> Path:
    """The shipped corpus, or (an installed copy without data/) the same text generated into the cache."""
    if SHIPPED_CORPUS.exists():
        return SHIPPED_CORPUS
    from tasks.common.datacache import cache_root

    path = cache_root() / "lm" / f"tiny_corpus_v{CORPUS_VERSION}.txt"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{id(path)}")
        tmp.write_text(tiny_corpus())
        tmp.replace(path)
    return path


def corpus_files(corpus: str | Path | None) -> list[Path]:
    """The text files of a corpus: the default when None, a file, or a folder's *.txt/*.md files."""
    path = default_corpus_path() if corpus is None else Path(corpus).expanduser()
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in CORPUS_SUFFIXES)
        if not files:
            raise ValueError(f"corpus folder {path} holds no {'/'.join(CORPUS_SUFFIXES)} files")
        return files
    raise ValueError(f"corpus {str(corpus)!r} is neither a file nor a folder; give a text file or a folder of .txt/.md files")


def load_documents(corpus: str | Path | None) -> list[str]:
    """The corpus's paragraphs (whitespace-trimmed, empty ones dropped), in file order."""
    docs = []
    for path in corpus_files(corpus):
        text = path.read_text(encoding="utf-8", errors="replace")
        docs += [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]
    if not docs:
        raise ValueError(f"corpus {corpus or default_corpus_path()} holds no text")
    return docs


def is_validation(doc: str, val_fraction: float) -> bool:
    """Stable split: the first 8 bytes of the document's SHA-256 as a fraction below val_fraction."""
    digest = int.from_bytes(hashlib.sha256(doc.encode("utf-8")).digest()[:8], "big")
    return digest / 2**64 < val_fraction


def split_documents(docs: list[str], val_fraction: float) -> tuple[list[str], list[str]]:
    """(train, validation) documents; ValueError when either is empty."""
    train = [d for d in docs if not is_validation(d, val_fraction)]
    val = [d for d in docs if is_validation(d, val_fraction)]
    if not train or not val:
        raise ValueError(
            f"val_fraction={val_fraction} splits {len(docs)} documents into {len(train)} train / {len(val)} validation; "
            "both must be non-empty (a corpus needs several paragraphs, separated by blank lines)"
        )
    return train, val


def token_stream(docs: list[str], tokenizer: ByteTokenizer) -> np.ndarray:
    """All documents as one int64 stream, each preceded by BOS."""
    parts = [np.asarray([tokenizer.bos_id, *tokenizer.encode(d)], dtype=np.int64) for d in docs]
    return np.concatenate(parts)


def windows(stream: np.ndarray, seq_len: int, max_windows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Non-overlapping next-token windows: (inputs, labels) int64 [N, seq_len], labels = inputs shifted by one.

    The tail shorter than a window is padded (labels -100) so no text is left out."""
    n = max(1, -(-(len(stream) - 1) // seq_len))
    if max_windows is not None:
        n = min(n, max_windows)
    padded = np.full(n * seq_len + 1, 0, dtype=np.int64)
    labels_src = np.full(n * seq_len + 1, -100, dtype=np.int64)
    used = min(len(stream), n * seq_len + 1)
    padded[:used], labels_src[:used] = stream[:used], stream[:used]
    inputs = padded[:-1].reshape(n, seq_len)
    labels = labels_src[1:].reshape(n, seq_len)
    return inputs, labels
