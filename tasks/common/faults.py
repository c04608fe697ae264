"""How the efficiency tasks and the timer describe a failed point: out-of-memory detection, a
one-line description for a record, and returning freed memory after a failure. Imports only
torch, so the timer (tasks/common/timing.py) loads without the mixers."""

from __future__ import annotations

import gc

import torch

_OOM_TEXT = ("out of memory", "can't allocate memory", "cannot allocate memory")


def is_oom(exc: BaseException) -> bool:
    """True for an out-of-memory of any device (torch's CUDA OOM, CPU allocator failures, MemoryError)."""
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(exc, RuntimeError) and any(s in str(exc).lower() for s in _OOM_TEXT)


def describe(exc: BaseException, limit: int = 400) -> str:
    """'Type: first line of the message', at most `limit` characters (for a record)."""
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0] if lines else ''}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def free_memory(device: torch.device | str) -> None:
    """Return freed blocks to the system (call after an exception's frames are gone)."""
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
