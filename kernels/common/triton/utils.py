"""Helpers shared by the Triton kernels: buffers, tile widths, dot precision, chunk sizes,
the chunk-parallel kernels' launch grids.

The gate unit (log2 gates, exp2 decays, the gate floor and gate modes) is gates.py; the
masked loads and stores are tiles.py; launch settings are kernels/common/launch/."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.common.dispatch import triton_interpret
from kernels.common.launch import GRID_YZ_MAX, ChunkLaunch, SequentialLaunch, settings
from kernels.common.triton.gates import GATE_NONE

VALID_CHUNK_SIZES = (16, 32, 64, 128)


@dataclass
class DebugFlags:
    """poison: buffers from `new_buffer` are filled with NaN, so any element a kernel
    fails to write shows up as NaN (tests turn this on; it costs a fill per buffer)."""

    poison: bool = os.environ.get("KERNELS_TRITON_POISON", "0") not in ("", "0")


DEBUG = DebugFlags()


@triton.jit
def chunk_and_head(AXIS: tl.constexpr, HEADS_FIRST: tl.constexpr):
    """(i_t, i_bh): this program's chunk and sequence of heads in a grid of chunk_grid's, whose
    axes AXIS and AXIS + 1 hold them, the chunks first unless HEADS_FIRST."""
    if HEADS_FIRST:
        return tl.program_id(AXIS + 1), tl.program_id(AXIS)
    return tl.program_id(AXIS), tl.program_id(AXIS + 1)


def chunk_grid(lead: tuple[int, ...], n_chunks: int, n_heads: int, heads_first: bool, where: str) -> tuple[int, ...]:
    """A launch grid of the `lead` axes, then n_chunks chunks and n_heads = B * H sequences of
    heads, the heads first (on the faster axis) where heads_first (DeltaLaunch.heads_first);
    read back in the kernel by chunk_and_head. Raises if an axis past the first would hold
    more than CUDA's 65,535 programs."""
    pair = (n_heads, n_chunks) if heads_first else (n_chunks, n_heads)
    grid = (*lead, *pair)
    over = [(axis, n) for axis, n in enumerate(grid) if axis and n > GRID_YZ_MAX]
    if over:
        axis, n = over[0]
        names = ("sequences of heads", "chunks") if heads_first else ("chunks", "sequences of heads")
        what = names[axis - len(lead)] if axis >= len(lead) else "blocks"
        raise ValueError(f"{where}: {n} {what} on grid axis {axis}, over CUDA's limit of "
                         f"{GRID_YZ_MAX} programs on every axis past the first")
    return grid


def new_buffer(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """torch.empty, or NaN-filled when DEBUG.poison is set."""
    t = torch.empty(shape, dtype=dtype, device=device)
    if DEBUG.poison:
        t.fill_(math.nan)
    return t


def block_size(dim: int, cap: int = 64) -> int:
    """Tile width for a feature dimension: a power of two in [16, cap] (tl.dot needs >= 16)."""
    return max(16, min(cap, triton.next_power_of_2(dim)))


def full_block(dim: int) -> int:
    """A tile covering the whole dimension: its next power of two, at least 16 (for kernels
    that keep a full K-wide state block in registers)."""
    return max(16, triton.next_power_of_2(dim))


def multiprocessors(device: torch.device) -> int | None:
    """The streaming multiprocessors of a CUDA device; None for any other device."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else None


def bf16_products(device: torch.device) -> bool:
    """Whether tl.dot multiplies bf16 tiles as bf16 on `device`: on a GPU; not on the CPU
    interpreter, which multiplies their uint16 storage (numpy has no bf16). Kernels that split
    fp32 tiles into bf16 parts for the tensor cores take their fp32 path where this is false."""
    return device.type != "cpu"


def sequential_block_v(
    V: int, cap: int, min_bv: int, min_waves: int, programs_per_block: int, device: torch.device
) -> int:
    """V-block of a kernel that walks a sequence's chunks in order in one program: `cap`
    (a power of two, at most V's), halved down to min_bv (at least 16) while
    programs_per_block * ceil(V / BV) programs would fill fewer than min_waves waves of the
    GPU's multiprocessors: with few sequences, more and narrower programs finish sooner.
    On the CPU the cap itself."""
    bv = block_size(V, cap)
    sms = multiprocessors(device)
    if sms is not None:
        floor = max(16, min_bv)
        while bv > floor and programs_per_block * triton.cdiv(V, bv) < min_waves * sms:
            bv //= 2
    return bv


def dot_precision(dtype: torch.dtype, fp32_dots: str = "ieee") -> str:
    """Dot precision of a kernel on `dtype` inputs. fp32 inputs get fp32_dots (the kernel's
    KernelLaunch.fp32_dots: "ieee", true fp32 products, or "tf32x3") unless torch allows TF32
    for fp32 matrix products (torch.set_float32_matmul_precision "high" or "medium", which the
    training loop sets for optim.matmul_precision="high"): then "tf32", as torch's own fp32
    matmuls. 16-bit inputs are multiplied in their own dtype with fp32 accumulation, where this
    setting is moot. Read at each launch, so a backward takes the precision in effect when it
    runs (the training loop holds one for the whole run)."""
    if dtype != torch.float32:
        return "tf32"
    return fp32_dots if torch.get_float32_matmul_precision() == "highest" else "tf32"


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


def chunk_op(gate: int) -> str:
    """The op whose launch settings a chunk-pipeline kernel with this gate mode runs under."""
    return "linear_attention" if gate == GATE_NONE else "gated_linear_attention"


def chunk_launch(gate: int) -> ChunkLaunch:
    """The chunk pipeline's launch settings in effect for a gate mode (kernels/common/launch/)."""
    return settings(chunk_op(gate))


def sequential_blocks(cfg: SequentialLaunch, K: int, V: int, n_heads: int, device: torch.device) -> tuple[int, int]:
    """(BK, BV) of a sequential state pass under `cfg`: its caps, BV narrowed as
    sequential_block_v says for n_heads = B * H sequences of K-blocks."""
    BK = block_size(K, cfg.BK)
    BV = sequential_block_v(V, cfg.BV, cfg.min_BV, cfg.min_waves, n_heads * triton.cdiv(K, BK), device)
    return BK, BV
