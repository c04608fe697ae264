"""The recurrent state of the linearized softmax GDN (docs/design.md §7) and its check."""

from __future__ import annotations

from typing import NamedTuple

import torch

from kernels.common.checks import check_state


class LinGDNState(NamedTuple):
    """State after `count` tokens: h [B, H, K, V], k_sum [B, H, K], v_sum [B, H, V] (fp32,
    fp64 for fp64 inputs) and count (tokens already seen, an int). count = 0 is the empty
    state: its tensors are ignored, since the first step's decay 1 - 1/1 = 0 erases h and
    the running means start from the first token."""

    h: torch.Tensor
    k_sum: torch.Tensor
    v_sum: torch.Tensor
    count: int


def check_lin_state(op: str, name: str, state: object, B: int, H: int, K: int, V: int) -> None:
    """ValueError unless `state` is None or a LinGDNState of the right shapes and count >= 0."""
    if state is None:
        return
    if not isinstance(state, LinGDNState):
        raise ValueError(f"{op}: {name} must be a LinGDNState(h, k_sum, v_sum, count) or None, "
                         f"got {type(state).__name__}")
    check_state(op, f"{name}.h", state.h, (B, H, K, V))
    check_state(op, f"{name}.k_sum", state.k_sum, (B, H, K))
    check_state(op, f"{name}.v_sum", state.v_sum, (B, H, V))
    count = state.count
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"{op}: {name}.count must be an int >= 0 (tokens already seen), got {count!r}")


def is_empty(state: LinGDNState | None) -> bool:
    """True for no state or a state that has seen no token."""
    return state is None or state.count == 0
