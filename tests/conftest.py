"""Suite-wide settings: offline libraries and one torch thread per test process (the suite
runs as two xdist workers on two cores; more threads oversubscribe the CPU and made single
test files up to 10x slower here)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")

import torch  # noqa: E402

torch.set_num_threads(1)
