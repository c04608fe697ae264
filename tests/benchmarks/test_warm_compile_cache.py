"""benchmarks/warm_compile_cache.py refuses a length the config does not train at, naming the
valid ones, before it compiles anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.warm_compile_cache import warm


def test_unknown_length_is_refused_with_the_valid_ones():
    with pytest.raises(SystemExit, match=r"--seq-len \[100\] is not a training length.*valid: \[64, 128, 256\]"):
        warm("gdn", "zoology", ["model.d_model=32", "model.mixer.backend=torch"], device="cpu", seq_lens={100})


def test_a_run_after_the_warm_up_compiles_nothing(tmp_path):
    """The warm-up compiles what the training loop then asks for: in a fresh process, a run with
    the same config finds every graph in the cache and writes no new cache entry."""
    import json
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    cache = tmp_path / "inductor"
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache), "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    sets = ["--set", "model.mixer.backend=torch", "--set", "optim.compile=true", "--set", "optim.epochs=1",
            "--set", "optim.early_stop=null", "--set", "optim.batch_size=8",
            "--set", "train=[{seq_len: 32, num_kv_pairs: 4, num_examples: 16}]",
            "--set", "test=[{seq_len: 32, num_kv_pairs: 4, num_examples: 8}]"]
    warm_up = subprocess.run([sys.executable, "-m", "benchmarks.warm_compile_cache", "--mixer", "gdn", "--d-model", "32",
                              "--device", "cpu", *sets], cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert warm_up.returncode == 0, warm_up.stderr[-3000:]
    before = sorted(str(p.relative_to(cache)) for p in cache.rglob("*") if p.is_file())
    assert before, "the warm-up wrote no cache entry"
    run = subprocess.run([sys.executable, "-m", "harness.cli", "run", "--mixer", "gdn", "--task", "mqar", "--preset",
                          "zoology", "--device", "cpu", "--no-wandb", "--results", str(tmp_path / "results"),
                          "--set", "model.d_model=32", *sets], cwd=root, env=env, capture_output=True, text=True,
                         timeout=600)
    (record,) = (tmp_path / "results" / "runs" / "mqar").glob("*.json")
    assert json.loads(record.read_text())["status"] == "ok", run.stdout[-2000:] + run.stderr[-2000:]
    after = sorted(str(p.relative_to(cache)) for p in cache.rglob("*") if p.is_file())
    assert after == before, f"the run compiled again: new cache entries {sorted(set(after) - set(before))[:5]}"
