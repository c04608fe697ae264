"""Print the training states under a resume folder that a device call brings back, furthest
along first, until their sizes reach a budget (a call returns at most 64 MiB).

    python -m benchmarks.resume_pick --budget-mb 48 <resume folder>   # paths relative to it
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def progress(state: Path) -> float:
    """Fraction of its training steps a saved state has run; -1 for one that cannot be read."""
    import torch

    try:
        saved = torch.load(state, map_location="cpu", weights_only=False)
        return saved["progress"]["step"] / max(1, saved["total_steps"])
    except Exception as e:  # noqa: BLE001 - an unreadable state is left out, and said so
        print(f"resume_pick: {state} unreadable ({type(e).__name__}), left out", file=sys.stderr)
        return -1.0


def pick(root: Path, budget_bytes: int) -> list[Path]:
    """The folders (relative to `root`) of the states to return, furthest along first."""
    ranked = sorted(((progress(p), p) for p in root.rglob("train_state.pt")), key=lambda t: -t[0])
    chosen, used = [], 0
    for frac, state in ranked:
        size = sum(f.stat().st_size for f in state.parent.iterdir() if f.is_file())
        if frac < 0 or used + size > budget_bytes:
            print(f"resume_pick: {state.parent} left behind ({frac:.2f} done, {size / 2**20:.1f} MiB)", file=sys.stderr)
            continue
        chosen.append(state.parent.relative_to(root))
        used += size
    return chosen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("--budget-mb", type=float, default=48.0)
    args = ap.parse_args()
    for folder in pick(args.root, int(args.budget_mb * 2**20)):
        print(folder)


if __name__ == "__main__":
    main()
