"""MesaNet's own argument checks (the ridge lamb, the MesaState, the CG options); each failure
is a ValueError naming the argument, what was received and what is valid."""

from __future__ import annotations

import torch

from kernels.common.checks import FLOAT_DTYPES, check_state, reads_values
from kernels.common.chunking import check_chunk_size
from kernels.mesa.state import MesaState


def check_lamb(op: str, name: str, lamb: torch.Tensor, H: int, K: int, check_values: bool = True) -> None:
    """lamb: a floating [H, K] tensor and, when reads_values allows, finite and > 0."""
    if not isinstance(lamb, torch.Tensor) or tuple(lamb.shape) != (H, K) or lamb.dtype not in FLOAT_DTYPES:
        got = f"shape {list(lamb.shape)}, {lamb.dtype}" if isinstance(lamb, torch.Tensor) else type(lamb).__name__
        raise ValueError(f"{op}: {name} must be a floating tensor of shape [H, K] = [{H}, {K}], got {got}")
    if not reads_values(lamb, check_values):
        return
    with torch.no_grad():
        lo, hi = lamb.min().item(), lamb.max().item()
    if not (lo > 0.0 and hi < float("inf")):
        raise ValueError(f"{op}: {name} must be finite and > 0 everywhere (ridge of H_kk), got values in [{lo}, {hi}]")


def check_mesa_state(op: str, name: str, state, B: int, H: int, K: int, V: int) -> MesaState | None:
    """None, or `state` as a MesaState of h_kk [B, H, K, K] and h_kv [B, H, K, V]."""
    if state is None:
        return None
    if not isinstance(state, tuple) or len(state) != 2:
        raise ValueError(f"{op}: {name} must be a MesaState(h_kk, h_kv) or None, got {type(state).__name__}")
    state = MesaState(*state)
    check_state(op, f"{name}.h_kk", state.h_kk, (B, H, K, K))
    check_state(op, f"{name}.h_kv", state.h_kv, (B, H, K, V))
    return state


def check_options(op: str, chunk_size: int, cg_steps: int, cg_tol: float | None) -> None:
    """chunk_size a positive int, cg_steps an int >= 0, cg_tol None or finite > 0."""
    check_chunk_size(op, chunk_size)
    if not isinstance(cg_steps, int) or cg_steps < 0:
        raise ValueError(f"{op}: cg_steps must be an int >= 0, got {cg_steps!r}")
    if cg_tol is not None and not (0.0 < float(cg_tol) < float("inf")):
        raise ValueError(f"{op}: cg_tol must be None or a finite number > 0, got {cg_tol!r}")
