"""CPU timings of every op in `kernels`: the reference backend vs the torch backend.

    python benchmarks/cpu_ops.py --out results/bench/cpu_ops.json
    python benchmarks/cpu_ops.py --T 256 512 --ops linear_attention gated_linear_attention

For each op and T it times forward (under torch.no_grad) and forward+backward (loss o.sum())
of both backends: median of several repeats after a warm-up, time.perf_counter. The per-token
references get slow at large T, so each measurement repeats only as often as fits in
--budget-s (a warm-up longer than the whole budget is kept as the only sample). Prints a
table with the ratio reference/torch and writes the JSON. An op that fails to import is
skipped with a message. On a shared machine, pass --threads 1: oversubscribed OpenMP
threads make every timing erratic.
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import statistics
import sys
import time
import types
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

Builder = Callable[[int, int, int, int, int, torch.Generator], dict]


def _qkv(B, T, H, K, V, gen, l2_keys=False):
    q = torch.randn(B, T, H, K, generator=gen)
    k = torch.randn(B, T, H, K, generator=gen)
    if l2_keys:  # the delta rules need unit keys for a contractive state update
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    return dict(q=q, k=k, v=torch.randn(B, T, H, V, generator=gen))


def _log_gate(*shape, gen):
    return F.logsigmoid(torch.randn(*shape, generator=gen))


def _beta(B, T, H, gen):
    return torch.sigmoid(torch.randn(B, T, H, generator=gen))


@dataclass(frozen=True)
class OpSpec:
    """One benchmarked call: `module.function(**build(...), backend=...)`."""

    label: str
    module: str
    function: str
    build: Builder


OP_SPECS = [
    OpSpec("softmax_attention", "kernels.softmax_attention", "softmax_attention",
           lambda B, T, H, K, V, gen: _qkv(B, T, H, K, V, gen)),
    OpSpec("linear_attention", "kernels.linear_attention", "linear_attention",
           lambda B, T, H, K, V, gen: _qkv(B, T, H, K, V, gen)),
    OpSpec("gated_linear_attention[scalar g]", "kernels.gated_linear_attention", "gated_linear_attention",
           lambda B, T, H, K, V, gen: _qkv(B, T, H, K, V, gen) | dict(g=_log_gate(B, T, H, gen=gen))),
    OpSpec("gated_linear_attention[vector g]", "kernels.gated_linear_attention", "gated_linear_attention",
           lambda B, T, H, K, V, gen: _qkv(B, T, H, K, V, gen) | dict(g=_log_gate(B, T, H, K, gen=gen))),
    OpSpec("delta_rule", "kernels.delta_rule", "delta_rule",
           lambda B, T, H, K, V, gen: _qkv(B, T, H, K, V, gen, l2_keys=True) | dict(beta=_beta(B, T, H, gen))),
    OpSpec("gated_delta_rule", "kernels.gated_delta_rule", "gated_delta_rule",
           lambda B, T, H, K, V, gen: _qkv(B, T, H, K, V, gen, l2_keys=True)
           | dict(g=_log_gate(B, T, H, gen=gen), beta=_beta(B, T, H, gen))),
    OpSpec("linearized_softmax_gdn", "kernels.linearized_softmax_gdn", "linearized_softmax_gdn",
           lambda B, T, H, K, V, gen: _qkv(B, T, H, K, V, gen)),
    OpSpec("vala_attention", "kernels.linearized_softmax_gdn", "vala_attention",
           lambda B, T, H, K, V, gen: _qkv(B, T, H, K, V, gen)),
    OpSpec("mesa", "kernels.mesa", "mesa",
           lambda B, T, H, K, V, gen: _qkv(B, T, H, K, V, gen, l2_keys=True)
           | dict(g=_log_gate(B, T, H, gen=gen), beta=_beta(B, T, H, gen),
                  lamb=F.softplus(torch.randn(H, K, generator=gen)) + 0.1)),
]


def _bare_kernels_package() -> None:
    """Register `kernels` as an empty package so each op folder imports on its own, without
    kernels/__init__.py (which imports every op at once)."""
    package = types.ModuleType("kernels")
    package.__path__ = [str(ROOT / "kernels")]
    sys.modules["kernels"] = package


def load_ops(labels: list[str] | None) -> tuple[list[tuple[OpSpec, Callable]], dict[str, str]]:
    """The importable ops among OP_SPECS (restricted to `labels`), and why others were skipped."""
    try:
        importlib.import_module("kernels")
    except Exception as err:  # noqa: BLE001 - any failure of an op folder must not stop the others
        print(f"note: `import kernels` failed ({type(err).__name__}: {err}); importing op folders one by one")
        _bare_kernels_package()
    loaded, skipped = [], {}
    for spec in OP_SPECS:
        if labels and spec.label not in labels and spec.label.split("[")[0] not in labels:
            continue
        try:
            loaded.append((spec, getattr(importlib.import_module(spec.module), spec.function)))
        except Exception as err:  # noqa: BLE001
            skipped[spec.label] = f"{type(err).__name__}: {err}"
            print(f"skip {spec.label}: cannot import {spec.module}.{spec.function} ({skipped[spec.label]})")
    return loaded, skipped


def time_call(run: Callable[[], None], budget_s: float, max_repeats: int) -> tuple[list[float], bool]:
    """One warm-up, then as many timed repeats as fit in budget_s (1 to max_repeats).

    A warm-up that alone takes longer than budget_s (a per-token reference at large T) is
    kept as the only sample: its one-time costs are negligible next to it, and a second run
    would double the cost of the slowest cells. Returns (times, warmup_kept).
    """
    start = time.perf_counter()
    run()
    warmup_s = time.perf_counter() - start
    if warmup_s > budget_s:
        return [warmup_s], True
    repeats = max(1, min(max_repeats, int(budget_s / max(warmup_s, 1e-9))))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return times, False


def make_run(fn: Callable, tensors: dict, backend: str, mode: str) -> Callable[[], None]:
    def forward():
        with torch.no_grad():
            fn(**tensors, backend=backend)

    def forward_backward():
        leaves = {name: t.detach().requires_grad_() for name, t in tensors.items()}
        o, _ = fn(**leaves, backend=backend)
        o.float().sum().backward()

    return forward if mode == "forward" else forward_backward


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def versions() -> dict:
    found = {"python": platform.python_version(), "torch": torch.__version__}
    try:
        import triton

        found["triton"] = triton.__version__
    except ImportError:
        found["triton"] = None
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="write the results JSON here")
    parser.add_argument("--T", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096])
    parser.add_argument("--B", type=int, default=1)
    parser.add_argument("--H", type=int, default=4)
    parser.add_argument("--K", type=int, default=64)
    parser.add_argument("--V", type=int, default=64)
    parser.add_argument("--ops", nargs="+", help="op labels to run (default: all importable)")
    parser.add_argument("--modes", nargs="+", default=["forward", "forward_backward"],
                        choices=["forward", "forward_backward"])
    parser.add_argument("--budget-s", type=float, default=3.0,
                        help="time for the repeats of one measurement (at least one repeat)")
    parser.add_argument("--max-repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's choice)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    ops, skipped = load_ops(args.ops)
    started = datetime.now(timezone.utc).isoformat()
    results, ratios, rows = [], [], []
    for spec, fn in ops:
        for T in args.T:
            tensors = spec.build(args.B, T, args.H, args.K, args.V, torch.Generator().manual_seed(T))
            for mode in args.modes:
                median = {}
                for backend in ("reference", "torch"):
                    record = dict(op=spec.label, T=T, mode=mode, backend=backend)
                    try:
                        times, warmup_kept = time_call(
                            make_run(fn, tensors, backend, mode), args.budget_s, args.max_repeats
                        )
                        median[backend] = statistics.median(times)
                        record |= dict(median_s=median[backend], times_s=times, repeats=len(times),
                                       warmup_kept=warmup_kept)
                    except Exception as err:  # noqa: BLE001 - record the failure, go on
                        record |= dict(error=f"{type(err).__name__}: {err}")
                        print(f"error {spec.label} T={T} {mode} {backend}: {record['error']}")
                    results.append(record)
                ratio = median["reference"] / median["torch"] if len(median) == 2 else None
                ratios.append(dict(op=spec.label, T=T, mode=mode, reference_over_torch=ratio))
                rows.append((spec.label, T, mode, median.get("reference"), median.get("torch"), ratio))
                print(_row(*rows[-1]), flush=True)

    print("\n" + _row("op", "T", "mode", "reference ms", "torch ms", "ref/torch", header=True))
    for row in rows:
        print(_row(*row))
    if args.out:
        report = dict(
            schema=1, benchmark="cpu_ops", device=cpu_name(), threads=torch.get_num_threads(),
            versions=versions(), started=started, finished=datetime.now(timezone.utc).isoformat(),
            config=dict(B=args.B, H=args.H, K=args.K, V=args.V, T=args.T, dtype="float32",
                        modes=args.modes, budget_s=args.budget_s, max_repeats=args.max_repeats,
                        forward="torch.no_grad()", backward="loss = o.sum()"),
            results=results, ratios=ratios, skipped=skipped,
        )
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nwrote {args.out}")
    return 0


def _row(op, T, mode, ref, tor, ratio, header=False) -> str:
    def ms(x):
        return x if header else ("-" if x is None else f"{x * 1e3:.2f}")

    ratio_text = ratio if header else ("-" if ratio is None else f"{ratio:.1f}x")
    return f"{op:34s} {T!s:>6} {mode:17s} {ms(ref):>13} {ms(tor):>11} {ratio_text:>10}"


if __name__ == "__main__":
    sys.exit(main())
