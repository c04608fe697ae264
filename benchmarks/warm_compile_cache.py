"""Fill the torch.compile caches for the MQAR runs a GPU call is about to pack side by side.

    python -m benchmarks.warm_compile_cache --mixer gdn --d-model 256 --sweep configs/mqar-paper.yaml \
        [--seq-len 256 ...]
    python -m benchmarks.warm_compile_cache --mixer gdn --d-model 256 [--preset zoology] \
        [--set optim.matmul_precision=high ...]

Runs packed on one GPU start together, so each compiles the same graphs at once and none finds
them in Inductor's caches (the FX graph and AOT autograd caches under TORCHINDUCTOR_CACHE_DIR),
while runs that differ only in the learning rate or the seed trace identical graphs. This
builds the task's model from the same config (with --sweep, the preset and `set`/`vary`
overrides of the sweep's first run of that mixer and width, so it cannot drift from the runs), compiles its loss as training does
(tasks.common.training.compiled_loss), and runs one forward and backward at each training
length, so a run started afterwards loads every graph from the cache instead of compiling it.
Prints the seconds per length and the cache counters. The cache key does not depend on
TORCHINDUCTOR_COMPILE_THREADS, so warm-ups may use every core, and one process per length
(--seq-len) compiles the lengths side by side.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch._dynamo.utils import counters

from benchmarks.warm_groups import group_point
from harness.config import resolve_config
from harness.sweep import SweepError, set_item
from tasks.common.model import MixerLM
from tasks.common.training import compiled_loss, float32_matmul
from tasks.mqar import MQAR
from tasks.mqar_data import make_mqar


def warm(mixer: str, preset: str, sets: list[str], device: str = "cuda",
         seq_lens: set[int] | None = None) -> list[dict]:
    """Compile the loss of `mixer`'s MQAR model at each training length of the config (or
    those of `seq_lens`: several processes can share the lengths out); returns
    [{seq_len, seconds}] in training order."""
    cfg = resolve_config(MQAR, preset, None, sets)
    longest = max(s.seq_len for s in [*cfg.train, *cfg.test])
    torch.manual_seed(0)
    model = MixerLM(mixer, cfg.vocab_size, cfg.model, max_positions=longest).to(device)
    loss_fn = compiled_loss(model)
    lengths = {s.seq_len for s in cfg.train}
    if seq_lens is not None and not seq_lens <= lengths:
        raise SystemExit(f"--seq-len {sorted(seq_lens - lengths)} is not a training length of this config; "
                         f"valid: {sorted(lengths)}")
    done, rows = set(), []
    with float32_matmul(cfg.optim.matmul_precision):
        for setting in cfg.train:
            if setting.seq_len in done or (seq_lens is not None and setting.seq_len not in seq_lens):
                continue  # one graph per length: the batch and the count are dynamic
            done.add(setting.seq_len)
            x, y = make_mqar(cfg.optim.batch_size, setting.seq_len, setting.num_kv_pairs, cfg.vocab_size, 0,
                             cfg.power_a, cfg.random_non_queries)
            tokens, labels = torch.from_numpy(x).long().to(device), torch.from_numpy(y).long().to(device)
            start = time.perf_counter()
            loss, _, _ = loss_fn(tokens, labels, int((labels != -100).sum()))
            loss.backward()
            if device == "cuda":
                torch.cuda.synchronize()
            rows.append({"seq_len": setting.seq_len, "seconds": time.perf_counter() - start})
            model.zero_grad(set_to_none=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mixer", required=True)
    parser.add_argument("--d-model", type=int, required=True)
    parser.add_argument("--sweep", type=Path, default=None,
                        help="take the preset and overrides of this sweep's first run of the mixer and width")
    parser.add_argument("--preset", default="zoology", help="without --sweep")
    parser.add_argument("--set", action="append", default=[], dest="sets",
                        help="a config override, after the sweep's (repeatable)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--seq-len", type=int, action="append", dest="seq_lens",
                        help="compile only this training length (repeatable; default: all of them)")
    args = parser.parse_args()
    preset, sets = args.preset, [f"model.d_model={args.d_model}", *args.sets]
    if args.sweep is not None:
        try:
            point = group_point(args.sweep, args.mixer, args.d_model)
        except SweepError as e:
            raise SystemExit(f"warm_compile_cache: {e}") from None
        preset, sets = point.preset, [*(set_item(k, v) for k, v in point.overrides), *args.sets]
    start = time.perf_counter()
    rows = warm(args.mixer, preset, sets, args.device, set(args.seq_lens) if args.seq_lens else None)
    per_length = ", ".join(f"T {r['seq_len']} {r['seconds']:.1f} s" for r in rows)
    print(f"warm {args.mixer} d_model {args.d_model}: {per_length}; {time.perf_counter() - start:.1f} s in all; "
          f"inductor {dict(counters['inductor'])}; aot {dict(counters['aot_autograd'])}", flush=True)


if __name__ == "__main__":
    main()
