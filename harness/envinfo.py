"""Facts about where a run happened: device name, library versions, git commit."""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path

import torch

import harness


def device_name(device: torch.device) -> str:
    """E.g. 'NVIDIA H200' or the CPU model ('cpu: AMD EPYC ...')."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"cpu: {model}"


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "cuda": torch.version.cuda,
        "harness": harness.__version__,
        "flash_attn": _version("flash-attn"),
        "fla": _version("fla-core") or _version("flash-linear-attention"),
    }


def git_commit() -> str | None:
    """The commit of the harness source tree, with '+dirty' when it has local changes.

    Where the tree is a copy without .git (a remote GPU box), HARNESS_GIT_COMMIT names it."""
    if os.environ.get("HARNESS_GIT_COMMIT"):
        return os.environ["HARNESS_GIT_COMMIT"]
    root = Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


@functools.cache
def process_commit() -> str | None:
    """git_commit() as it was at this process's first call (its first run), kept for the
    process's life: Python goes on running the modules it imported then, so a commit or an
    edit made while a multi-run command or a sweep worker goes on must not relabel its later
    runs."""
    return git_commit()
