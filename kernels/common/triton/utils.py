"""Helpers shared by the Triton kernels: buffers, block sizes, gate modes, dot precision."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import triton

from kernels.common.dispatch import triton_interpret

# exp(x) == exp2(x * LOG2E): cumulative gates are kept in log2 units so kernels use exp2.
LOG2E = 1.4426950408889634

# The strongest decay one token's gate applies inside the kernels, in log2 units: every
# per-token log-gate below it (-inf, a full reset, included) is raised to it before the
# chunk-local cumulative sums. The kernels form decays as exp2(gamma_i - gamma_j) of those
# sums, and one -inf would make every later difference in its chunk -inf - (-inf) = NaN.
# 2^-80 leaves nothing of a state fp32 can hold. The floor sits below the vector-gate
# kernels' factored span (64, triton_vector.FACTORED_SPAN), so a gate it raises still
# sends its chunk down the path its true value would, and close enough to keep the sums
# small: every decay inherits their rounding, ulp(|gamma|), 2^-17 past one floored gate
# while the rest of the chunk's gates sum above -48.
GATE_FLOOR_LOG2 = -80.0

# Gate modes, passed to kernels as a constexpr.
GATE_NONE, GATE_SCALAR, GATE_VECTOR = 0, 1, 2

VALID_CHUNK_SIZES = (16, 32, 64, 128)


@dataclass
class DebugFlags:
    """poison: buffers from `new_buffer` are filled with NaN, so any element a kernel
    fails to write shows up as NaN (tests turn this on; it costs a fill per buffer)."""

    poison: bool = os.environ.get("KERNELS_TRITON_POISON", "0") not in ("", "0")


DEBUG = DebugFlags()


def new_buffer(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """torch.empty, or NaN-filled when DEBUG.poison is set."""
    t = torch.empty(shape, dtype=dtype, device=device)
    if DEBUG.poison:
        t.fill_(math.nan)
    return t


def block_size(dim: int, cap: int = 64) -> int:
    """Tile width for a feature dimension: a power of two in [16, cap] (tl.dot needs >= 16)."""
    return max(16, min(cap, triton.next_power_of_2(dim)))


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs get true fp32 dots (tf32 would miss the 1e-4 tolerance); 16-bit inputs
    are multiplied in their own dtype with fp32 accumulation, where this setting is moot."""
    return "ieee" if dtype == torch.float32 else "tf32"


def check_chunk_size(op: str, chunk_size: int) -> int:
    """The Triton kernels need a power-of-two chunk in VALID_CHUNK_SIZES."""
    if chunk_size not in VALID_CHUNK_SIZES:
        raise ValueError(
            f"{op}: backend='triton' needs chunk_size in {list(VALID_CHUNK_SIZES)}, got {chunk_size!r}"
        )
    return chunk_size


def warps(gpu: int) -> int:
    """num_warps for a launch: the tuned value on a GPU, 1 under the interpreter (where it
    only multiplies the emulation work)."""
    return 1 if triton_interpret() else gpu
