"""Launch settings of MesaNet's kernels (kernels/mesa; MesaLaunch)."""

from __future__ import annotations

import dataclasses

from kernels.common.launch.base import TILE_WIDTHS, KernelLaunch, check_pow2

SOLVE_OPERANDS = ("fp32", "fp16_scaled", "fp16_normed")
DOT_PRECISIONS = ("ieee", "tf32", "tf32x3")


@dataclasses.dataclass(frozen=True)
class SolveLaunch:
    """Launch settings of mesa's CG kernels (kernels/mesa/triton_solve.py).

    rows: rows (tokens) per program, the chunk or a fraction of it, narrow_rows (0: rows) at
    head dims up to narrow_max_K (rows_for); num_warps: on a GPU, narrow_num_warps at head dims
    up to narrow_max_K (warps_for);
    weights_scan: segment sums by a running sum instead of an fp32 FMA product
    (chunk_weights); diag_cg_prec: diag(M) (the Jacobi start only) at the CG loop's dot
    precision instead of fp32 FMAs (the same for fp32 inputs); operands: the CG mat-vecs'
    operands, "fp32" (tiles at the CG dot precision) or fp16 scaled per row, by its largest
    entry ("fp16_scaled", triton_system.matvec_half) or by a norm the CG loop carries
    ("fp16_normed", matvec_normed: no row reductions per mat-vec); the fp16 forms apply to
    16-bit inputs only (fp32 inputs keep true fp32 products)."""

    rows: int = 64
    narrow_rows: int = 0
    num_warps: int = 8
    narrow_num_warps: int = 4
    narrow_max_K: int = 64
    weights_scan: bool = False
    diag_cg_prec: bool = False
    operands: str = "fp32"

    def __post_init__(self) -> None:
        check_pow2(self, "num_warps", (1, 2, 4, 8, 16, 32))
        check_pow2(self, "narrow_num_warps", (1, 2, 4, 8, 16, 32))
        check_pow2(self, "rows")
        check_pow2(self, "narrow_rows", (0, *TILE_WIDTHS))
        if self.operands not in SOLVE_OPERANDS:
            raise ValueError(f"SolveLaunch.operands must be one of {SOLVE_OPERANDS}, got {self.operands!r}")

    def warps_for(self, BK: int) -> int:
        """num_warps of a program whose K-block is BK wide: narrow_num_warps up to narrow_max_K.
        Every CG program holds its tiles in about 255 registers a thread (sm_90 screen), so an
        8-warp program fills an SM's register file alone; where the tiles are small enough that
        per-step latency, not dot throughput, sets the time (K = 64), two 4-warp programs
        sharing an SM take half the time, and at K = 128 4 warps take twice as long (one H100,
        T = 2k, forward / backward solve: K = 64 7,828 / 14,684 -> 3,999 / 7,555 us; K = 128
        8,529 / 10,292 -> 15,749 / 25,638 us; records 20261206T194448 and T194514)."""
        return self.narrow_num_warps if BK <= self.narrow_max_K else self.num_warps

    def rows_for(self, BK: int) -> int:
        """Rows per program of a launch whose K-block is BK wide: narrow_rows (where set) up to
        narrow_max_K, rows above."""
        return self.narrow_rows if self.narrow_rows and BK <= self.narrow_max_K else self.rows


@dataclasses.dataclass(frozen=True)
class GradsLaunch(KernelLaunch):
    """Launch settings of mesa's gradient kernel (kernels/mesa/triton_grads.py). BC: key
    columns of dk per step (a power of two; capped at the whole K-block): below it the
    [K, K] state gradient is read in [K, BC] column blocks, never held whole."""

    BC: int = 256

    def __post_init__(self) -> None:
        super().__post_init__()
        check_pow2(self, "BC")


@dataclasses.dataclass(frozen=True)
class StateLaunch:
    """Launch settings of mesa's state passes (kernels/mesa/triton_states.py).

    max_BK / max_BD: widest row / column block of a state (powers of two, 16 .. 128); the
    column block narrows down to min_BD while there would be fewer than min_programs
    programs per multiprocessor (each program walks every chunk in turn); num_warps,
    num_stages: on a GPU."""

    max_BK: int = 128
    max_BD: int = 64
    min_BD: int = 16
    min_programs: int = 2
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self) -> None:
        for name in ("max_BK", "max_BD", "min_BD"):
            check_pow2(self, name, (16, 32, 64, 128))
        if self.min_BD > self.max_BD:
            raise ValueError(f"StateLaunch.min_BD ({self.min_BD}) exceeds max_BD ({self.max_BD})")


@dataclasses.dataclass(frozen=True)
class MesaLaunch:
    """Launch settings and 16-bit dot precisions of mesa (kernels/mesa/triton_function.py).

    prec: every dot outside the CG loops, cg_prec: the CG loops' dots, both for fp16/bf16
    inputs only (fp32 inputs always take "ieee"): tf32 is about 5e-4 relative per product,
    far below bf16's rounding. The CG kernels of the backward run 32 rows per program above
    head dim 64 (fewer registers; 1.2x faster at T = 8192), the forward the whole 64-token chunk, both
    on fp16 operands scaled by a carried norm (fwd / bwd 14.8 / 20.4 -> 12.1 / 16.2 ms at
    T = 8192 against per-row scaling). The state passes take 128-row blocks
    (1.62 -> 1.14 ms forward at T = 2048)."""

    prec: str = "tf32"
    cg_prec: str = "tf32"
    fwd_solve: SolveLaunch = SolveLaunch(rows=64, num_warps=8, weights_scan=True, diag_cg_prec=True,
                                         operands="fp16_normed")
    # The adjoint CG at K <= 64 (4 warps) on the forward's 64 rows: backward solve 7,590 /
    # 7,573 / 7,648 -> 4,638 / 4,600 / 4,622 us at T = 2k / 8k / 32k, K = 64 (forward+backward
    # 17.6 / 18.3 / 20.2 -> 14.6 / 15.0 / 17.1 ms); at K = 128 (8 warps) 64 rows lose, 10,243 ->
    # 12,948 us at 2k (one H100, records 20261207T143217, T143240)
    bwd_solve: SolveLaunch = SolveLaunch(rows=32, narrow_rows=64, num_warps=8, weights_scan=True, diag_cg_prec=True,
                                         operands="fp16_normed")
    states: StateLaunch = StateLaunch(max_BK=128, max_BD=64, min_BD=16, min_programs=2, num_warps=4, num_stages=2)
    # The gradient kernel, one H100, T = 2k / 8k / 32k, 4 warps over 32-column key blocks:
    # K = 64 3,547 / 3,679 / 3,821 us, K = 128 5,480 / 5,579 / 5,592, against 8 warps over the
    # whole K 5,416 / 5,574 / 5,708 and 5,467 / 5,561 / 5,572 (16 warps 17.8 ms at either;
    # records 20261206T223730-T223821); its GPU test errors equal the 8-warp form's to the
    # digit (2026-12-07; 4 warps over narrow blocks is where Triton 3.6 has miscompiled other
    # kernels: NarrowVLaunch)
    grads: GradsLaunch = GradsLaunch(num_warps=4, num_stages=1, BC=32)

    def __post_init__(self) -> None:
        for name in ("prec", "cg_prec"):
            if getattr(self, name) not in DOT_PRECISIONS:
                raise ValueError(f"MesaLaunch.{name} must be one of {DOT_PRECISIONS}, got {getattr(self, name)!r}")
