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
