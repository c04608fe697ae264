"""What every kernel's launch settings share: num_warps, num_stages and the precision of fp32
dots (KernelLaunch), tile caps (TileLaunch), the narrowing of a sequential pass's V-block
(SequentialLaunch, NarrowingLaunch) and fewer warps on narrow V-blocks (NarrowVLaunch)."""

from __future__ import annotations

import dataclasses

TILE_WIDTHS = (16, 32, 64, 128, 256)
GRID_YZ_MAX = 65535  # CUDA's limit on a grid's second and third axes
FP32_DOTS = ("ieee", "tf32x3")  # KernelLaunch.fp32_dots


def check_pow2(owner: object, name: str, allowed: tuple[int, ...] = TILE_WIDTHS) -> None:
    """Raise ValueError naming owner's class, the field and the valid values unless the field
    `name` of `owner` is one of `allowed` (by default the tile widths)."""
    value = getattr(owner, name)
    if value not in allowed:
        raise ValueError(f"{type(owner).__name__}.{name} must be one of {list(allowed)}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class KernelLaunch:
    """num_warps and num_stages of one kernel's launch (the interpreter runs 1 warp whatever
    num_warps says: kernels/common/triton/utils.warps), and fp32_dots: the precision of the
    dots that would otherwise take true fp32 products ("ieee": fp32 inputs under torch's
    "highest" float32 matmul precision, and the delta rules' chunk inverse), one of
    FP32_DOTS. Triton lowers "ieee" dots to scalar FMAs, off the tensor cores; "tf32x3" splits
    each operand into two TF32 parts and sums three tensor-core products, close to fp32's
    rounding (a candidate for the default once timed and held to the fp32 bounds on a GPU)."""

    num_warps: int = 4
    num_stages: int = 2
    fp32_dots: str = "ieee"

    def __post_init__(self) -> None:
        check_pow2(self, "num_warps", (1, 2, 4, 8, 16, 32))
        if self.num_stages < 1:
            raise ValueError(f"{type(self).__name__}.num_stages must be >= 1, got {self.num_stages!r}")
        if self.fp32_dots not in FP32_DOTS:
            raise ValueError(f"{type(self).__name__}.fp32_dots must be one of {list(FP32_DOTS)}, got {self.fp32_dots!r}")


@dataclasses.dataclass(frozen=True)
class TileLaunch(KernelLaunch):
    """A kernel tiled over keys (BK) and values (BV)."""

    BK: int = 64
    BV: int = 64

    def __post_init__(self) -> None:
        super().__post_init__()
        check_pow2(self, "BK")
        check_pow2(self, "BV")


@dataclasses.dataclass(frozen=True)
class SequentialLaunch(TileLaunch):
    """A state pass that walks a sequence's chunks in order in one program: with few
    sequences it halves BV, down to min_BV, while the grid would fill fewer than min_waves
    waves of the GPU's multiprocessors (kernels/common/triton/utils.sequential_block_v)."""

    min_BV: int = 32
    min_waves: int = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        check_pow2(self, "min_BV")


@dataclasses.dataclass(frozen=True)
class NarrowingLaunch:
    """How the delta rules' sequential passes narrow their V-block: halved, down to min_BV,
    while heads x V-blocks would fill fewer than min_waves waves of the GPU."""

    min_BV: int = 32
    min_waves: int = 2

    def __post_init__(self) -> None:
        check_pow2(self, "min_BV")


@dataclasses.dataclass(frozen=True)
class NarrowVLaunch(TileLaunch):
    """A delta-rule tile kernel whose warps drop to narrow_num_warps where its V-block is under
    64 columns. On the H200 (Triton 3.6, bf16) 4 warps at V-blocks of 16 and 32 miscompile:
    wy_bwd's dv and dbeta (rel. err. 0.9; dk and dg through them), and output_fwd's o and
    du_local's dU at K = 128 (tests/gpu/test_delta_stages_gpu.py); wy_bwd is right with 2
    warps, and every kernel is right with 4 at V-blocks of 64 and 128."""

    narrow_num_warps: int = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        check_pow2(self, "narrow_num_warps", (1, 2, 4, 8, 16, 32))

    def warps_for(self, BV: int) -> int:
        """num_warps of a launch whose V-block is BV wide."""
        return self.narrow_num_warps if BV < 64 else self.num_warps
