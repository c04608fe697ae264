"""Heatmap figures (accuracy by two settings), drawn without pyplot so no GUI backend is needed."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class HeatmapPanel:
    """One heatmap: values [rows, cols] in [vmin, vmax] (NaN = no data), with axis labels."""

    title: str
    values: np.ndarray
    row_labels: list[str]
    col_labels: list[str]
    row_name: str
    col_name: str


def save_heatmaps(panels: list[HeatmapPanel], path: Path, title: str, vmin: float = 0.0, vmax: float = 1.0,
                  columns: int = 3) -> None:
    """Draw the panels on a grid (annotated cells, one shared colour scale) and save a PNG."""
    from matplotlib.figure import Figure

    ncols = min(columns, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig = Figure(figsize=(4.2 * ncols + 0.8, 3.2 * nrows + 0.6))
    # fixed margins: constrained layout costs seconds per figure on a busy CPU
    fig.subplots_adjust(left=0.06, right=0.9, bottom=0.1, top=0.9, wspace=0.3, hspace=0.45)
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    image = None
    for ax, panel in zip(axes, panels):
        values = np.asarray(panel.values, dtype=float)
        image = ax.imshow(values, cmap="viridis", vmin=vmin, vmax=vmax, aspect="auto", origin="lower")
        ax.set_xticks(range(len(panel.col_labels)), panel.col_labels, fontsize=8)
        ax.set_yticks(range(len(panel.row_labels)), panel.row_labels, fontsize=8)
        ax.set_xlabel(panel.col_name, fontsize=9)
        ax.set_ylabel(panel.row_name, fontsize=9)
        ax.set_title(panel.title, fontsize=10)
        for (r, c), value in np.ndenumerate(values):
            if np.isfinite(value):
                # dark text on the bright end of viridis, light text elsewhere
                shade = (value - vmin) / (vmax - vmin) if vmax > vmin else 0.0
                ax.text(c, r, f"{value:.2f}", ha="center", va="center", fontsize=7,
                        color="black" if shade > 0.6 else "white")
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    if image is not None:
        fig.colorbar(image, cax=fig.add_axes((0.92, 0.15, 0.015, 0.7)))
    fig.suptitle(title, fontsize=11)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
