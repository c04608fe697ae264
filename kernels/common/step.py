"""The checks and backend choice every one-token decode step (`<op>_step`) runs.

A step's public function hands its arguments to `check_step`, which runs the step checks
of kernels.common.checks in one order for every op (q_t, k_t, v_t; the gate; beta_t; the
state; scale), so that an argument wrong in two ways gives the same message whichever
op it reaches. The linear ops then call `linear_step`: the fused Triton step where
resolve_step_backend picks it, else their PyTorch step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import torch

from kernels.common.checks import check_state, check_step_beta, check_step_gate, check_step_qkv, default_scale
from kernels.common.dispatch import resolve_step_backend

# (op, state, B, H, K, V) -> the state as the step takes it; raises ValueError when it is wrong.
StateCheck = Callable[[str, Any, int, int, int, int], Any]


def matrix_state(op: str, state: torch.Tensor | None, B: int, H: int, K: int, V: int) -> torch.Tensor | None:
    """A [B, H, K, V] state tensor, or None (zeros)."""
    check_state(op, "state", state, (B, H, K, V))
    return state


class StepArgs(NamedTuple):
    B: int
    H: int
    K: int
    V: int
    state: Any
    scale: float


def check_step(
    op: str,
    q_t: torch.Tensor,
    k_t: torch.Tensor,
    v_t: torch.Tensor,
    state: Any,
    scale: float | None,
    gate: Literal["none", "scalar", "scalar_or_vector"] = "none",
    g_t: torch.Tensor | None = None,
    beta: bool = False,
    beta_t: torch.Tensor | None = None,
    state_check: StateCheck = matrix_state,
) -> StepArgs:
    """Check one token's arguments of step `op` (ValueError naming `op`) and return the sizes,
    the state as `state_check` returns it and the scale (default K ** -0.5).

    gate: "scalar" takes g_t [B, H], "scalar_or_vector" also [B, H, K], "none" no gate;
    beta: whether beta_t [B, H] is taken; state_check: the op's state check (checks of other
    arguments that must come before the state's, such as mesa's lamb, run inside it)."""
    B, H, K, V = check_step_qkv(op, q_t, k_t, v_t)
    if gate != "none":
        check_step_gate(op, g_t, B, H, K if gate == "scalar_or_vector" else None)
    if beta:
        check_step_beta(op, beta_t, B, H)
    state = state_check(op, state, B, H, K, V)
    return StepArgs(B, H, K, V, state, default_scale(op, scale, K))


def linear_step(
    op: str,
    backend: str,
    torch_step: Callable[[], tuple[torch.Tensor, torch.Tensor]],
    q_t: torch.Tensor,
    k_t: torch.Tensor,
    v_t: torch.Tensor,
    g_t: torch.Tensor | None,
    beta_t: torch.Tensor | None,
    state: torch.Tensor | None,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(o_t, new state) of a checked linear-op step: the fused Triton step
    (kernels/common/triton/step.py) where resolve_step_backend picks "triton", else torch_step()."""
    if resolve_step_backend(op, backend, [q_t, k_t, v_t, g_t, beta_t, state]) == "triton":
        from kernels.common.triton.step import fused_step  # lazy: triton is optional

        return fused_step(q_t, k_t, v_t, g_t, beta_t, state, scale)
    return torch_step()
