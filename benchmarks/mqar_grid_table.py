"""Markdown table of the MQAR paper grid from its run records: per mixer and d_model, the
accuracy at each learning rate and the best of them (Zoology reports the best lr).

    python -m benchmarks.mqar_grid_table [--sweep configs/mqar-paper.yaml] [--results results]

The grid (mixers, presets, widths, lrs and the fixed `set` options) is read from the sweep
file's first block; a record counts for a grid point when its task, preset, device type and
every `set` option match. A cell is the record's accuracy (mean over test settings); "·" marks
a grid point with no record yet. When a point has several records, the newest counts. The last
line gives the device time the counted records span, runs side by side counted once."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from harness.config import EXECUTION_ONLY
from harness.leaderboard import flatten_config
from harness.records import RunRecord, device_type_of, load_records
from harness.sweep import load_sweep

WIDTH, LR = "model.d_model", "optim.lr"


@dataclass(frozen=True)
class Grid:
    """The points of a sweep block that vary d_model and lr."""

    task: str
    preset: str
    device: str
    mixers: tuple[str, ...]
    widths: tuple[int, ...]
    lrs: tuple[float, ...]
    fixed: dict[str, Any]


def read_grid(sweep_file: Path) -> Grid:
    """The grid of the sweep file's first block (its vary must hold d_model and lr)."""
    sweep = load_sweep(sweep_file)
    block = sweep.grid[0]
    if WIDTH not in block.vary or LR not in block.vary:
        raise SystemExit(f"{sweep_file}: the first grid block must vary {WIDTH} and {LR}")
    return Grid(
        task=block.tasks[0], preset=(block.presets or sweep.presets)[0],
        device=sweep.device if sweep.device != "auto" else "cuda",
        mixers=tuple(block.mixers or sweep.mixers),
        widths=tuple(sorted(int(d) for d in block.vary[WIDTH])),
        lrs=tuple(sorted(float(lr) for lr in block.vary[LR])),
        # Execution-only options (torch.compile) choose how a run executes, not which run it is.
        fixed={k: v for k, v in {**sweep.set, **block.set}.items()
               if tuple(k.split(".", 1)) not in EXECUTION_ONLY},
    )


def grid_records(results: Path, grid: Grid) -> dict[tuple[str, int, float], RunRecord]:
    """(mixer, d_model, lr) -> the newest ok record of that grid point under <results>/runs."""
    newest: dict[tuple[str, int, float], RunRecord] = {}
    for _, rec in load_records(results):
        if (rec.task, rec.preset, rec.status) != (grid.task, grid.preset, "ok"):
            continue
        if device_type_of(rec.device) != grid.device or "accuracy" not in rec.metrics:
            continue
        flat = flatten_config(rec.config)
        if any(flat.get(k) != v for k, v in grid.fixed.items()):
            continue
        key = (rec.mixer, int(flat[WIDTH]), float(flat[LR]))
        if key[1] in grid.widths and any(abs(key[2] - lr) <= 1e-9 * lr for lr in grid.lrs):
            key = (key[0], key[1], min(grid.lrs, key=lambda lr: abs(lr - key[2])))
            if key not in newest or rec.finished > newest[key].finished:
                newest[key] = rec
    return newest


def busy_minutes(records: list[RunRecord]) -> float:
    """Minutes with at least one of the records' runs going: the union of their
    [started, finished] spans (runs packed side by side count once)."""
    spans = sorted((datetime.fromisoformat(r.started), datetime.fromisoformat(r.finished)) for r in records)
    total, end = 0.0, None
    for s, e in spans:
        if end is None or s > end:
            total, end = total + (e - s).total_seconds(), e
        elif e > end:
            total, end = total + (e - end).total_seconds(), e
    return total / 60


def to_markdown(grid: Grid, cells: dict[tuple[str, int, float], float]) -> str:
    """One row per mixer; per d_model the best accuracy (at which lr) and the accuracy at each
    lr in ascending order."""
    head = ["mixer"]
    for d in grid.widths:
        head += [f"d{d} best (lr)", f"d{d}: " + " / ".join(f"{lr:.3g}" for lr in grid.lrs)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in grid.mixers:
        row = [m]
        for d in grid.widths:
            got = {lr: cells[(m, d, lr)] for lr in grid.lrs if (m, d, lr) in cells}
            best = max(got, key=got.get) if got else None
            row.append(f"{got[best]:.3f} ({best:.3g})" if best is not None else "·")
            row.append(" / ".join(f"{got[lr]:.3f}" if lr in got else "·" for lr in grid.lrs))
        lines.append("| " + " | ".join(row) + " |")
    total = len(grid.mixers) * len(grid.widths) * len(grid.lrs)
    lines += ["", f"{len(cells)} of {total} grid points have a record."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", default=Path("configs/mqar-paper.yaml"), type=Path)
    parser.add_argument("--results", default=Path("results"), type=Path)
    args = parser.parse_args()
    if not (args.results / "runs").is_dir():
        parser.error(f"--results {args.results} holds no runs/ folder of run records")
    grid = read_grid(args.sweep)
    records = grid_records(args.results, grid)
    print(to_markdown(grid, {key: float(rec.metrics["accuracy"]) for key, rec in records.items()}))
    # A run resumed across device calls holds the span of its last call only.
    print(f"Records' spans merged: {busy_minutes(list(records.values())):.0f} minutes with at least one "
          "grid run going (a resumed run counts its last call only).")


if __name__ == "__main__":
    main()
