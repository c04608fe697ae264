"""The crossover length of a mixer against softmax attention: the smallest T from which the
mixer is faster, i.e. faster at that T and at every larger T measured.

Between the last grid point where the mixer is not faster and the first from which it
stays faster, T is interpolated where log(mixer time / softmax time) crosses zero, linear
in log T (times of both grow about as powers of T, so the log-ratio is close to linear in
log T between neighbouring grid points)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal


@dataclass(frozen=True)
class Crossover:
    """T: the crossover length, or None when the mixer is not faster at the largest T measured.
    kind: 'interpolated' between two grid points, 'below_grid' (already faster at the
    smallest T measured: T is that length, an upper bound), 'none' (T is None), or
    'no_data' (no T where both were measured)."""

    T: float | None
    kind: Literal["interpolated", "below_grid", "none", "no_data"]
    measured: int  # grid points where both times exist

    def as_dict(self) -> dict:
        return asdict(self)


def crossover(points: list[tuple[int, float | None, float | None]]) -> Crossover:
    """Crossover from (T, mixer_ms, softmax_ms) triples; a None time (failed point) is skipped.

    Faster means mixer_ms < softmax_ms strictly."""
    usable = sorted(
        (T, m, s) for T, m, s in points
        if m is not None and s is not None and m > 0 and s > 0 and math.isfinite(m) and math.isfinite(s)
    )
    if not usable:
        return Crossover(None, "no_data", 0)
    log_ratio = [math.log(m / s) for _, m, s in usable]
    if log_ratio[-1] >= 0:
        return Crossover(None, "none", len(usable))
    first = len(usable) - 1  # first index of the run of "faster" points reaching the end
    while first > 0 and log_ratio[first - 1] < 0:
        first -= 1
    if first == 0:
        return Crossover(float(usable[0][0]), "below_grid", len(usable))
    (t0, r0), (t1, r1) = (usable[first - 1][0], log_ratio[first - 1]), (usable[first][0], log_ratio[first])
    # r0 >= 0 > r1: the zero of the line through (log t0, r0) and (log t1, r1).
    log_t = math.log(t0) + r0 / (r0 - r1) * (math.log(t1) - math.log(t0))
    return Crossover(math.exp(log_t), "interpolated", len(usable))
