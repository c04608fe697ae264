"""The sharding of benchmarks/fla_warm_compile.py: each worker compiles its share of every
autotuner's configurations, the shares cover all of them, and none is left empty."""

from __future__ import annotations

import types

import pytest

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402 - after the skip: triton is optional

from benchmarks.fla_warm_compile import shard_autotuners  # noqa: E402 - imports triton too


@triton.jit
def _copy(x, y, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    tl.store(y + o, tl.load(x + o))


def fake_module():
    module = types.ModuleType("fake_fla_module")
    module.big = triton.autotune([triton.Config({"BLOCK": 16}, num_warps=w) for w in (1, 2, 4, 8, 16)], key=[])(_copy)
    module.small = triton.autotune([triton.Config({"BLOCK": 32}, num_warps=4)], key=[])(_copy)
    module.alias = module.big  # the same autotuner twice: sharded once
    module.other = 3
    return module


def test_shards_cover_every_configuration_once():
    shares = []
    for index in range(3):
        module = fake_module()
        kept = shard_autotuners([module], index, 3)
        assert len(module.small.configs) == 1  # fewer configurations than shards: one each
        assert kept == len(module.big.configs) + 1
        shares.append([c.num_warps for c in module.big.configs])
    assert shares == [[1, 8], [2, 16], [4]]


def test_bad_shard_index():
    with pytest.raises(ValueError, match="shard index"):
        shard_autotuners([fake_module()], 3, 3)


def test_every_op_has_an_fla_kernel_in_its_spec():
    from benchmarks.fla_warm_compile import OPS
    from kernels.registry import SPECS

    for name, variant in OPS.values():
        assert SPECS[name].fla_kernel(variant) is not None, (name, variant)


def test_unknown_head_shape_is_refused_before_any_worker_starts(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "fla_warm_compile.py"
    done = subprocess.run([sys.executable, str(script), "--op", "gdn", "--heads", "16x128,8x8"],
                          env={"TRITON_CACHE_DIR": str(tmp_path), "PATH": ""}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0
    assert "--heads '16x128,8x8'" in done.stderr and "['16x128', '32x64']" in done.stderr
    assert not any(tmp_path.iterdir())


def test_workers_are_cut_to_the_gpu_memory():
    from benchmarks.fla_warm_compile import processes_for

    assert processes_for(14, 79.2, 12) == 6  # an H100: fourteen and nine ran it out of memory
    assert processes_for(14, 139.8, 12) == 11  # an H200
    assert processes_for(4, 79.2, 12) == 4
    assert processes_for(14, 5.0, 12) == 1  # at least one
    with pytest.raises(ValueError, match="gib_per_proc"):
        processes_for(14, 79.2, 0)
    with pytest.raises(ValueError, match="requested"):
        processes_for(0, 79.2, 8)


def test_refused_without_a_gpu(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "fla_warm_compile.py"
    done = subprocess.run([sys.executable, str(script), "--op", "gdn"], env={"TRITON_CACHE_DIR": str(tmp_path),
                          "PATH": ""}, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "no CUDA GPU" in done.stderr
