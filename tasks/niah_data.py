"""Token-level needle-in-a-haystack data, modelled on RULER's NIAH family.

A sequence of length L is a haystack with needles inserted in it, then the queries:

    haystack ... NEEDLE key v_1..v_m ... haystack ... QUERY key v_1..v_m

A needle is [NEEDLE, key, value tokens]; a query is [QUERY, key] followed by the values of
that key (teacher-forced), so the model predicts each value token from the tokens before it.
Labels hold the value tokens after a query and -100 everywhere else (the MQAR convention:
inputs = tokens[:-1], labels = tokens[1:]). An answer is one value; it counts as recalled
only if all of its tokens are predicted (exact match).

A variant fixes the haystack (a repeated pattern, passkey-like, or random tokens), how
many keys have needles, how many needles each key has (multi-value: all its values follow
its query, in order of appearance), how many keys are queried (multi-query; the others are
distractors, multi-key) and the value length (one token, or several: uuid-like).
The target needle (the first value of the first queried key) is placed at a given depth
(0 = start of the haystack, 1 = right before the queries); the other needles at random.

Token ids: NEEDLE = 0, QUERY = 1, then the keys, the values and the filler tokens, in
disjoint ranges, so a key or value never appears in the haystack by chance.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

GENERATOR_VERSION = 1
NEEDLE, QUERY = 0, 1


class NIAHVariant(BaseModel):
    """One needle-in-a-haystack variant (RULER: single, multi-key, multi-value, multi-query)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9_]+$", description="label in metrics and plots")
    haystack: Literal["repeat", "random"] = Field(
        "random", description="repeat: a fixed pattern (passkey); random: random filler")
    keys: int = Field(1, ge=1, description="keys that have needles (queried ones plus distractors)")
    values_per_key: int = Field(1, ge=1, description="needles per key; all values of a queried key are scored")
    queries: int = Field(1, ge=1, description="keys queried at the end")
    value_len: int = Field(1, ge=1, description="tokens per value (>1: uuid-like)")

    @model_validator(mode="after")
    def _queries_fit(self):
        if self.queries > self.keys:
            raise ValueError(f"variant {self.name!r}: queries={self.queries} exceeds keys={self.keys}")
        return self

    @property
    def num_needles(self) -> int:
        return self.keys * self.values_per_key

    @property
    def num_answers(self) -> int:
        """Scored values per sequence."""
        return self.queries * self.values_per_key

    def query_len(self) -> int:
        """Tokens of the query region: [QUERY, key, values] per queried key."""
        return self.queries * (2 + self.values_per_key * self.value_len)

    def filler_len(self, seq_len: int) -> int:
        """Haystack tokens left around the needles in a sequence of seq_len inputs."""
        return seq_len + 1 - self.query_len() - self.num_needles * (2 + self.value_len)


@dataclass(frozen=True)
class NIAHVocab:
    """Sizes of the disjoint token ranges; the repeated haystack cycles the first pattern_len fillers."""

    num_keys: int
    num_values: int
    num_filler: int
    pattern_len: int

    @property
    def size(self) -> int:
        return 2 + self.num_keys + self.num_values + self.num_filler

    @property
    def key_start(self) -> int:
        return 2

    @property
    def value_start(self) -> int:
        return 2 + self.num_keys

    @property
    def filler_start(self) -> int:
        return 2 + self.num_keys + self.num_values


@dataclass
class NIAHBlock:
    """Sequences of one (variant, length).

    inputs, labels, answer_ids: int64 [N, L]; answer_ids is the index of the answer a
    scored position belongs to (-1 elsewhere). answer_depths: float64 [N, A], the depth
    in [0, 1] of the needle holding each answer (A = variant.num_answers)."""

    inputs: np.ndarray
    labels: np.ndarray
    answer_ids: np.ndarray
    answer_depths: np.ndarray

    def as_dict(self) -> dict[str, np.ndarray]:
        return {"inputs": self.inputs, "labels": self.labels, "answer_ids": self.answer_ids, "answer_depths": self.answer_depths}


def check_variant(variant: NIAHVariant, seq_len: int, vocab: NIAHVocab) -> None:
    """ValueError naming the parameter when a variant cannot be laid out."""
    if variant.filler_len(seq_len) < 1:
        need = seq_len + 1 - variant.filler_len(seq_len)
        raise ValueError(
            f"seq_len={seq_len} is too short for variant {variant.name!r} "
            f"({variant.num_needles} needles of {2 + variant.value_len} tokens, {variant.query_len()} query tokens): "
            f"need seq_len >= {need}"
        )
    if variant.keys > vocab.num_keys:
        raise ValueError(f"variant {variant.name!r} needs {variant.keys} distinct keys; num_keys={vocab.num_keys}")
    if variant.num_needles > vocab.num_values:
        raise ValueError(
            f"variant {variant.name!r} needs {variant.num_needles} distinct values; num_values={vocab.num_values}"
        )
    if variant.haystack == "repeat" and not 1 <= vocab.pattern_len <= vocab.num_filler:
        raise ValueError(f"pattern_len={vocab.pattern_len} must lie in [1, num_filler={vocab.num_filler}]")


def make_niah(
    variant: NIAHVariant, num_examples: int, seq_len: int, vocab: NIAHVocab, seed: int,
    depths: np.ndarray | None = None,
) -> NIAHBlock:
    """Generate sequences of `seq_len` inputs. depths: [num_examples] target-needle depths in
    [0, 1], or None for uniformly random depths (training)."""
    check_variant(variant, seq_len, vocab)
    if depths is not None:
        depths = np.asarray(depths, dtype=np.float64)
        if depths.shape != (num_examples,) or depths.min(initial=0) < 0 or depths.max(initial=0) > 1:
            raise ValueError(f"depths must be [{num_examples}] values in [0, 1], got shape {depths.shape}")
    rng = np.random.default_rng(seed)
    n_answers = variant.num_answers
    inputs = np.empty((num_examples, seq_len), dtype=np.int64)
    labels = np.empty((num_examples, seq_len), dtype=np.int64)
    answer_ids = np.empty((num_examples, seq_len), dtype=np.int64)
    answer_depths = np.empty((num_examples, n_answers), dtype=np.float64)
    for i in range(num_examples):
        depth = rng.random() if depths is None else depths[i]
        seq, lab, aid, adepth = _one_sequence(variant, seq_len, vocab, rng, depth)
        inputs[i], labels[i], answer_ids[i], answer_depths[i] = seq[:-1], lab[1:], aid[1:], adepth
    return NIAHBlock(inputs, labels, answer_ids, answer_depths)


def _one_sequence(variant: NIAHVariant, seq_len: int, vocab: NIAHVocab, rng: np.random.Generator, depth: float):
    """One sequence of seq_len + 1 tokens (so inputs and labels can be shifted by one)."""
    v = variant
    keys = rng.choice(vocab.num_keys, size=v.keys, replace=False) + vocab.key_start
    # values[key, j]: the j-th needle of a key; first tokens distinct within the sequence
    # so no two needles share a value start.
    firsts = rng.choice(vocab.num_values, size=v.num_needles, replace=False)
    values = rng.integers(0, vocab.num_values, size=(v.num_needles, v.value_len))
    values[:, 0] = firsts
    values = (values + vocab.value_start).reshape(v.keys, v.values_per_key, v.value_len)

    n_fill = v.filler_len(seq_len)
    if v.haystack == "repeat":
        filler = vocab.filler_start + np.arange(n_fill) % vocab.pattern_len
    else:
        filler = vocab.filler_start + rng.integers(0, vocab.num_filler, size=n_fill)

    # Needle slots: insertion points into the filler, target (key 0, value 0) at `depth`.
    slots = rng.integers(0, n_fill + 1, size=(v.keys, v.values_per_key))
    slots[0, 0] = round(depth * n_fill)
    order = np.lexsort((rng.random(v.num_needles), slots.ravel()))  # by slot, random ties

    pieces, appearance, cursor = [], np.empty(v.num_needles, dtype=np.int64), 0
    for rank, flat in enumerate(order):
        key_idx, val_idx = divmod(int(flat), v.values_per_key)
        slot = int(slots[key_idx, val_idx])
        pieces.append(filler[cursor:slot])
        pieces.append(np.concatenate([[NEEDLE, keys[key_idx]], values[key_idx, val_idx]]))
        appearance[flat] = rank
        cursor = slot
    pieces.append(filler[cursor:])
    context = np.concatenate(pieces)

    # Queries: the first `queries` keys, in random order, each followed by its values in
    # order of appearance.
    query_parts, lab_parts, aid_parts, adepth = [], [], [], np.empty(v.num_answers)
    answer = 0
    for key_idx in rng.permutation(v.queries):
        query_parts.append(np.array([QUERY, keys[key_idx]]))
        lab_parts.append(np.array([-100, -100]))
        aid_parts.append(np.array([-1, -1]))
        for val_idx in np.argsort(appearance[key_idx * v.values_per_key : (key_idx + 1) * v.values_per_key]):
            query_parts.append(values[key_idx, val_idx])
            lab_parts.append(values[key_idx, val_idx])
            aid_parts.append(np.full(v.value_len, answer))
            adepth[answer] = slots[key_idx, val_idx] / n_fill
            answer += 1
    seq = np.concatenate([context, *query_parts])
    lab = np.concatenate([np.full(len(context), -100), *lab_parts])
    aid = np.concatenate([np.full(len(context), -1), *aid_parts])
    assert len(seq) == seq_len + 1
    return seq, lab, aid, adepth


def answer_correct(correct: np.ndarray, answer_ids: np.ndarray, num_answers: int) -> np.ndarray:
    """Exact match per answer: [N, A] bool, True when every token of the answer is right.

    correct: [N, L] bool per position (from `predict`); answer_ids: [N, L] as in NIAHBlock."""
    scored = answer_ids >= 0
    rows, _ = np.nonzero(scored)
    wrong = np.zeros((answer_ids.shape[0], num_answers), dtype=bool)
    np.logical_or.at(wrong, (rows, answer_ids[scored]), ~correct[scored])
    present = np.zeros_like(wrong)
    present[rows, answer_ids[scored]] = True
    if not present.all():
        raise ValueError("answer_ids do not cover every answer of every sequence")
    return ~wrong
