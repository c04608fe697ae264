"""Markdown table of MQAR run records: what each run changed from its preset, and what it got.

    python -m benchmarks.mqar_ablation_table results/ablations/mqar-gpu-recipe [more folders]

Each row names the config keys whose values differ from the record's preset (the mixer's
per_mixer entry folded in), then accuracy (mean over test settings), pooled accuracy, the
final training loss and steps per second."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from harness.config import resolve_config
from harness.leaderboard import flatten_config
from harness.records import load_records
from tasks.registry import get_task

IGNORED = {"optim.eval_batch_size"}


def changes(record) -> str:
    """The record's config keys that differ from its preset's, as key=value."""
    base = resolve_config(get_task(record.task), record.preset, None, []).model_dump(mode="json")
    mine, theirs = flatten_config(record.config), flatten_config(base)
    # Keys the record lacks are options newer than the record; they are not its changes.
    diff = [f"{k}={_short(mine[k])}" for k in sorted(mine)
            if k not in IGNORED and not k.startswith("model.per_mixer.") and mine[k] != theirs.get(k)]
    return ", ".join(diff) or "(preset)"


def _short(value: Any) -> str:
    """Settings lists as (T, pairs, examples) triples; anything else as it is."""
    if isinstance(value, list) and value and isinstance(value[0], dict) and "seq_len" in value[0]:
        return "[" + " ".join(f"({s['seq_len']},{s['num_kv_pairs']},{s['num_examples']})" for s in value) + "]"
    return str(value)


def rows(folder: Path) -> list[str]:
    out = []
    for _, r in load_records(folder):
        m = r.metrics
        speed = m.get("train_steps", 0) / m["train_time_s"] if m.get("train_time_s") else float("nan")
        out.append(
            f"| {folder.name} | {r.preset} | {r.mixer} | {r.config['model']['d_model']} | {r.config['optim']['lr']:g} "
            f"| {changes(r)} | {m.get('accuracy', float('nan')):.3f} | {m.get('accuracy_pooled', float('nan')):.3f} "
            f"| {m.get('final_loss', float('nan')):.3f} | {speed:.1f} |")
    return out


def main(folders: list[str]) -> None:
    print("| records | preset | mixer | d_model | lr | changed from the preset | accuracy | pooled | final loss | steps/s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for folder in folders:
        for row in rows(Path(folder)):
            print(row)


if __name__ == "__main__":
    main(sys.argv[1:])
