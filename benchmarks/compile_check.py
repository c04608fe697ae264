"""Before a sweep that compiles its training steps: one compiled step of the zoology model (GDN
unless --mixer says otherwise) against the eager step, on this machine's GPU (or CPU), for two
batch sizes of one length.

Exits non-zero when the compiled loss or gradients differ from the eager ones beyond fp32
rounding, or when the second batch size compiled a second graph; prints the compile time.
    python -m benchmarks.compile_check [--mixer gdn] [--d-model 64]
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from torch._dynamo.utils import counters

from tasks.common.model import MixerLM, ModelConfig
from tasks.common.training import compiled_loss, float32_matmul
from tasks.mqar import ZOOLOGY_PRESET


def _batch(rows: int, length: int, pairs: int, device: torch.device, gen: torch.Generator):
    x = torch.randint(0, 8192, (rows, length), generator=gen)
    y = torch.full((rows, length), -100)
    y[:, length - pairs:] = torch.randint(4096, 8192, (rows, pairs), generator=gen)
    return x.to(device), y.to(device), rows * pairs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mixer", default="gdn")
    ap.add_argument("--d-model", type=int, default=64)
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    options = {**ZOOLOGY_PRESET["model"], "d_model": args.d_model}
    options["mixer"] = {**options["mixer"], "backend": "torch"}
    torch.manual_seed(0)
    model = MixerLM(args.mixer, 8192, ModelConfig(**options)).to(device).eval()  # eval: no dropout
    loss_fn, gen, worst = compiled_loss(model), torch.Generator().manual_seed(0), 0.0
    before = counters["stats"]["unique_graphs"]
    with float32_matmul("highest"):
        for rows in (256, 160):
            x, y, scored = _batch(rows, 256, 64, device, gen)
            start = time.perf_counter()
            loss_c = loss_fn(x, y, scored)[0]
            loss_c.backward()
            grads_c = [p.grad.clone() for p in model.parameters()]
            model.zero_grad(set_to_none=True)
            elapsed = time.perf_counter() - start
            loss_e = model.loss(x, y, scored)[0]
            loss_e.backward()
            for p, g in zip(model.parameters(), grads_c):
                worst = max(worst, float((p.grad - g).abs().max() / p.grad.abs().max().clamp_min(1e-30)))
            model.zero_grad(set_to_none=True)
            print(f"{args.mixer} rows {rows}: first call {elapsed:.1f} s, loss {loss_c.item():.6f} "
                  f"(eager {loss_e.item():.6f}), worst gradient error {worst:.2e} of its largest entry")
            if abs(loss_c.item() - loss_e.item()) > 1e-4 * abs(loss_e.item()):
                print("compiled loss differs from the eager loss", file=sys.stderr)
                return 1
    graphs = counters["stats"]["unique_graphs"] - before
    if worst > 1e-3 or graphs != 1:
        print(f"failed: worst gradient error {worst:.2e} (bound 1e-3), {graphs} graphs (want 1)", file=sys.stderr)
        return 1
    print(f"ok: {device}, {graphs} graph for two batch sizes, worst gradient error {worst:.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
