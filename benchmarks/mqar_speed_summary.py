"""Steps/s of MQAR training runs, alone and packed on one GPU, from their run records.

    python -m benchmarks.mqar_speed_summary --alone results/ablations/mqar-gpu-alone \
        --packed results/ablations/mqar-gpu-zoology-vs-paper results/ablations/mqar-gpu-recipe \
        results/ablations/mqar-gpu-pairs --out results/findings/mqar_steps_h200.json

A run's rate is train_steps / train_time_s (its own training loop, evaluation excluded);
`outside_training_s` is the rest of its wall time (process start, data, evaluation, record).
Packed folders each hold one wave of runs that started together, so their rates add up to the
GPU's throughput for that wave."""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.json_record import save_record
from harness.records import load_records


def run_rows(folder: Path) -> list[dict]:
    rows = []
    for _, r in load_records(folder):
        m = r.metrics
        rows.append({
            "run_id": r.run_id, "mixer": r.mixer, "preset": r.preset, "d_model": r.config["model"]["d_model"],
            "backend": r.backend, "device": r.device, "train_steps": m["train_steps"],
            "step_mode": ((r.details or {}).get("train_step") or {}).get("mode", "eager"),
            "steps_per_s": m["train_steps"] / m["train_time_s"],
            "outside_training_s": r.duration_s - m["train_time_s"] if r.duration_s else None,
        })
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--alone", type=Path, nargs="+", required=True)
    parser.add_argument("--packed", type=Path, nargs="+", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    alone = [row for folder in args.alone for row in run_rows(folder)]
    waves = []
    for folder in args.packed:
        rows = run_rows(folder)
        rates = [row["steps_per_s"] for row in rows]
        waves.append({"records": str(folder), "runs": len(rows), "steps_per_s_sum": sum(rates),
                      "steps_per_s_min": min(rates), "steps_per_s_max": max(rates), "rows": rows})
    record = {"what": "MQAR training steps/s, one run alone and runs packed on one GPU (from run records)",
              "alone": alone, "packed": waves}
    save_record(record, str(args.out))
    for row in alone:
        print(f"alone  {row['mixer']:8s} d={row['d_model']} {row['train_steps']:.0f} steps {row['steps_per_s']:.1f}/s, "
              f"{row['outside_training_s']:.1f} s outside training")
    for wave in waves:
        rates = f"{wave['steps_per_s_min']:.1f}-{wave['steps_per_s_max']:.1f}/s each"
        print(f"packed {wave['records']}: {wave['runs']} runs, {rates}, "
              f"{wave['steps_per_s_sum']:.0f}/s together")


if __name__ == "__main__":
    main()
