"""Every Triton kernel the ops launch compiles for Hopper (sm_90) with the installed Triton,
on a machine without a GPU (tests/compile_sm90.py, in a process of its own: the compiler
never runs where TRITON_INTERPRET is set, as it is for the interpreter tests)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")


def test_every_kernel_compiles_for_sm90():
    script = Path(__file__).resolve().parents[1] / "compile_sm90.py"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(script)], check=False, env=env, capture_output=True, text=True,
                          timeout=1500)
    report = done.stdout[-6000:] + done.stderr[-3000:]
    assert done.returncode == 0, report
    assert " 0 failed" in done.stdout and "launches compiled" in done.stdout, report


def test_training_step_takes_the_shape_and_dtype_and_refuses_others():
    """The spill screen's step: fp32 inputs at the asked shape; an unknown dtype names the valid ones."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from compile_sm90 import training_step

    with pytest.raises(ValueError, match=r"dtype 'fp16': valid are \['bf16', 'fp32'\]"):
        training_step("gated_delta_rule", None, 16, dtype="fp16")
    step = training_step("gated_delta_rule", None, 16, dtype="fp32", value_dim=32, batch=2, seq_len=40)
    leaves = {id(c.cell_contents): c.cell_contents for c in step.__closure__ if isinstance(c.cell_contents, dict)}
    (args,) = leaves.values()
    assert args["q"].shape == (2, 40, 2, 16) and args["v"].shape == (2, 40, 2, 32)
    assert args["q"].dtype.is_floating_point and str(args["q"].dtype) == "torch.float32"
