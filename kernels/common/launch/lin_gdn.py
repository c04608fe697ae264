"""Launch settings of linearized_softmax_gdn's own kernels (LinGdnLaunch); its delta rule
runs under gated_delta_rule's."""

from __future__ import annotations

import dataclasses

from kernels.common.launch.base import KernelLaunch, check_pow2


@dataclasses.dataclass(frozen=True)
class PrepLaunch(KernelLaunch):
    """The linearized softmax GDN's running-mean kernels (linearized_softmax_gdn/triton_prep.py):
    tile_elems = BT * BD rows x features per loop step (enough bytes in flight per program);
    the feature block BD is halved from max_BD, down to min_BD, while fewer than
    min_programs programs would run. fwd_by_dot / bwd_by_dot: the forward's in-tile sums of
    16-bit inputs, the backward's of the fp32 cotangents (for a 16-bit dx), as products with
    triangular ones (kernels/common/triton/prefix.py; at most 64 rows a step). segment_rows
    (0: off): sequences longer than this many rows (a power of two, at least 64: whole
    chunks) are scanned in segments of that many rows, each by its own programs, after a
    pass that sums each segment; segment_max_heads (0: any): only where B * H is at most this
    many sequences of heads (with more, the programs already fill the GPU and the extra pass
    costs)."""

    max_BD: int = 64
    min_BD: int = 16
    tile_elems: int = 4096
    min_programs: int = 512
    fwd_by_dot: bool = False
    bwd_by_dot: bool = False
    segment_rows: int = 0
    segment_max_heads: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_pow2(self, "max_BD")
        check_pow2(self, "min_BD")
        if self.segment_rows and (self.segment_rows < 64 or self.segment_rows & (self.segment_rows - 1)):
            raise ValueError(f"PrepLaunch.segment_rows must be 0 (off) or a power of two >= 64, got {self.segment_rows!r}")
        if self.segment_max_heads < 0:
            raise ValueError(f"PrepLaunch.segment_max_heads must be >= 0 (0: any), got {self.segment_max_heads!r}")

    def segments_at(self, n_heads: int, T: int) -> bool:
        """Whether B * H = n_heads sequences of T rows are scanned in segments."""
        return (bool(self.segment_rows) and T > self.segment_rows
                and (not self.segment_max_heads or n_heads <= self.segment_max_heads))


MEAN_FORMS = ("auto", "scan", "dots", "stored")  # LinGdnLaunch.mean_form
MEAN_ACC_RULES = ("never", "one_wave", "always")  # LinGdnLaunch.mean_in_acc


@dataclasses.dataclass(frozen=True)
class LinGdnLaunch:
    """Launch settings of linearized_softmax_gdn's own kernels; its delta rule runs the
    gated_delta_rule kernels under that op's settings, except that its training forward
    runs the state pass and then the output kernel (which adds the running mean of v),
    wherever gated_delta_rule's fused_fwd would fuse them, unless train_fused and the head
    dim is at most train_fused_max_K (fuses_training)."""

    # The scans' in-tile sums on the tensor cores (fwd_by_dot, bwd_by_dot): running_mean_fwd
    # 522 / 548 / 869 -> 430 / 512 / 842 us and running_mean_bwd 1,061 / 1,126 / 1,189 -> 632 /
    # 641 / 1,030 at T = 2k / 8k / 32k, K = 128 (one H100, records 20261207T024458, T024423)
    prep: PrepLaunch = PrepLaunch(max_BD=64, min_BD=16, tile_elems=4096, min_programs=512, num_warps=4, num_stages=3,
                                  fwd_by_dot=True, bwd_by_dot=True)
    # The training pass with the output and the running mean fused took 2,047 us at 2k, K =
    # 128 (GDN's without the mean 1,199); unfused, the state pass and the output take 566 +
    # 748, and lin_gdn's forward+backward 8.41 -> 7.60 ms there, but at K = 64 (2k) 6.54 ->
    # 6.71 (8k and 32k, where the fused pass does not run: within 1 %; one H100, records
    # 20261206T194925, T224016)
    train_fused: bool = True
    train_fused_max_K: int = 64
    # How the output forms the running mean of v it adds (MEAN_FORMS): "scan", in-chunk sums by
    # tl.cumsum, a scan inside the state pass's sequential loop; "dots", those sums of 16-bit v
    # as a product with triangular ones (kernels/common/triton/prefix.py); "stored", not at all:
    # the scan of v writes the mean whole in v's dtype (one more [B, T, H, V] write there) and
    # the output only loads and adds it (candidate 21, not taken: lin_gdn's forward at T = 2k / 8k
    # / 32k 2.11 / 2.23 / 2.52 -> 1.95 / 2.06 / 2.55 ms at K = 128, 1.94 / 2.19 / 2.62 -> 2.01 /
    # 2.13 / 2.77 at K = 64, forward+backward within 1 %; one H100); "auto", per pass
    # (RunningMean.sums_by_dot): dots in the output kernel, and in the fused state pass at K <=
    # 64 or within one wave of programs. One H100, T = 2k / 8k / 32k (records 20261207T024423,
    # T024458), scan -> dots: the output kernel 761 / 768 / 780 -> 701 / 715 / 740 us at K =
    # 128, the no-gradient fused pass 750 / 1,052 / 1,499 -> 592 / 810 / 1,056 at K = 64, and
    # at K = 128 1,187 / 1,174 / 1,738 -> 1,483 / 1,478 / 1,195 (2,048 / 512 / 128 programs on
    # 132 multiprocessors)
    mean_form: str = "auto"
    # Where a pass takes the dots, whether the product with triangular ones accumulates into
    # the output's own fp32 tile scaled by t rather than into a tile of its own added after
    # (MEAN_ACC_RULES, RunningMean.accumulates): "always"; "one_wave", in the fused state pass
    # where its programs fill at most one wave; "never". One H100 (Triton 3.7.1, records
    # 20261207T103211, T103303, T103312), no-gradient fused pass: at 32k (128 programs on 132
    # multiprocessors) 1,273 -> 1,206 us at K = 128 and 959 -> 915 at K = 64, the forward 2.590 /
    # 2.675 -> 2.521 / 2.628 ms; at 8k, K = 64 (512 programs) 695 -> 789; at 2k, K = 64 and in
    # the output kernel within 1 %; with the dots at K = 128 and more programs 1,109 -> 1,426
    mean_in_acc: str = "one_wave"

    def __post_init__(self) -> None:
        if not isinstance(self.train_fused_max_K, int) or self.train_fused_max_K < 0:
            raise ValueError(f"LinGdnLaunch.train_fused_max_K must be an int >= 0, got {self.train_fused_max_K!r}")
        if self.mean_form not in MEAN_FORMS:
            raise ValueError(f"LinGdnLaunch.mean_form must be one of {list(MEAN_FORMS)}, got {self.mean_form!r}")
        if self.mean_in_acc not in MEAN_ACC_RULES:
            raise ValueError(f"LinGdnLaunch.mean_in_acc must be one of {list(MEAN_ACC_RULES)}, got {self.mean_in_acc!r}")

    def fuses_training(self, K: int) -> bool:
        """Whether the training forward at head dim K may fuse its output into the state pass."""
        return self.train_fused and K <= self.train_fused_max_K
