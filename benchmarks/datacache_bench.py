"""Time generating MQAR training data against loading it from the data cache (CPU).

    python -m benchmarks.datacache_bench [--out results/findings/datacache_cpu.json]

For the `default`, `paper` and `zoology` presets' training settings: the generator's time, the first
call's (generate + save) and a second call's (load), each the median of three runs in a fresh
cache. Writes one JSON record with the machine and versions."""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.json_record import save_record
from harness.config import resolve_config
from tasks.common.datacache import cached_arrays
from tasks.mqar_data import GENERATOR_VERSION, make_mqar
from tasks.registry import get_task


def time_preset(preset: str) -> dict:
    cfg = resolve_config(get_task("mqar"), preset, None, [])
    generate, first, load = [], [], []
    for repeat in range(3):
        os.environ["HARNESS_CACHE"] = tempfile.mkdtemp(prefix="cache-bench-")
        t0 = time.perf_counter()
        for i, s in enumerate(cfg.train):
            make_mqar(s.num_examples, s.seq_len, s.num_kv_pairs, cfg.vocab_size, i, cfg.power_a, cfg.random_non_queries)
        generate.append(time.perf_counter() - t0)
        for times in (first, load):
            t0 = time.perf_counter()
            for i, s in enumerate(cfg.train):
                spec = {"v": GENERATOR_VERSION, "bench": repeat, "i": i, **s.model_dump()}
                cached_arrays("mqar-bench", spec, lambda s=s, i=i: dict(zip(("inputs", "labels"), make_mqar(
                    s.num_examples, s.seq_len, s.num_kv_pairs, cfg.vocab_size, i, cfg.power_a, cfg.random_non_queries))))
            times.append(time.perf_counter() - t0)
    sequences = sum(s.num_examples for s in cfg.train)
    return {"preset": preset, "sequences": sequences, "generate_s": statistics.median(generate),
            "generate_and_save_s": statistics.median(first), "load_s": statistics.median(load)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/findings/datacache_cpu.json"))
    args = parser.parse_args()
    import datasets
    import torch

    rows = [time_preset(p) for p in ("default", "paper", "zoology")]
    record = {"what": "MQAR training data: generate vs load from the data cache (medians of 3)",
              "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
              "versions": {"python": platform.python_version(), "numpy": np.__version__,
                           "datasets": datasets.__version__, "torch": torch.__version__},
              "date": time.strftime("%Y-%m-%d"), "rows": rows}
    save_record(record, str(args.out))
    for r in rows:
        print(f"{r['preset']}: {r['sequences']} sequences, generate {r['generate_s']:.2f} s, "
              f"generate+save {r['generate_and_save_s']:.2f} s, load {r['load_s']:.2f} s")


if __name__ == "__main__":
    main()
