"""benchmarks/warm_compile_cache.py refuses a length the config does not train at, naming the
valid ones, before it compiles anything."""

from __future__ import annotations

import pytest

from benchmarks.warm_compile_cache import warm


def test_unknown_length_is_refused_with_the_valid_ones():
    with pytest.raises(SystemExit, match=r"--seq-len \[100\] is not a training length.*valid: \[64, 128, 256\]"):
        warm("gdn", "zoology", ["model.d_model=32", "model.mixer.backend=torch"], device="cpu", seq_lens={100})
