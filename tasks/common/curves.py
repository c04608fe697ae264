"""Line-plot panels (e.g. error against sequence length), drawn without pyplot."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Curve:
    """One line: x and y values (NaN or non-positive y are skipped on a log axis)."""

    label: str
    x: list[float]
    y: list[float]
    dashed: bool = False


@dataclass(frozen=True)
class CurvePanel:
    title: str
    xlabel: str
    ylabel: str
    curves: list[Curve] = field(default_factory=list)
    logx: bool = True
    logy: bool = True


def save_curve_panels(panels: list[CurvePanel], path: Path, title: str, columns: int = 3) -> None:
    """Draw the panels on a grid, each with its own legend, and save a PNG."""
    from matplotlib.figure import Figure

    ncols = min(columns, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig = Figure(figsize=(4.6 * ncols, 3.6 * nrows + 0.5))
    # fixed margins: constrained layout costs seconds per figure on a busy CPU
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.12, top=0.88, wspace=0.3, hspace=0.45)
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    for ax, panel in zip(axes, panels):
        for curve in panel.curves:
            x, y = np.asarray(curve.x, dtype=float), np.asarray(curve.y, dtype=float)
            keep = np.isfinite(y) & ((y > 0) if panel.logy else True)
            ax.plot(x[keep], y[keep], "--" if curve.dashed else "-", marker="o", markersize=3, label=curve.label)
        if panel.logx:
            ax.set_xscale("log", base=2)
        if panel.logy:
            ax.set_yscale("log")
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlabel(panel.xlabel, fontsize=9)
        ax.set_ylabel(panel.ylabel, fontsize=9)
        ax.grid(True, which="major", alpha=0.3)
        if panel.curves:
            ax.legend(fontsize=7)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=11)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
