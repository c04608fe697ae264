"""Suite-wide settings: offline libraries, an isolated data cache, one torch thread per
xdist worker (two workers on two cores would otherwise oversubscribe the CPU)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")

import torch  # noqa: E402

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)
