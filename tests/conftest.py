"""Suite-wide settings: offline libraries and one torch thread per test process (the suite
runs as two xdist workers on two cores; more threads oversubscribe the CPU and made single
test files up to 10x slower here)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")

import torch  # noqa: E402

torch.set_num_threads(1)

# Without a GPU, Triton kernels run in the interpreter. The flag must be set before any kernel
# module is imported in this process (@triton.jit reads it at decoration time), and with xdist a
# worker may import kernels from any test file first, so it is set here for the whole session.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
