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
from typing import TYPE_CHECKING, Callable

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

if TYPE_CHECKING:
    from kernels.common.spec import OpSpec

@dataclass(frozen=True)
class Case:
    """One benchmarked call: op `spec` on its input factory's `variant`."""

    label: str
    spec: OpSpec
    variant: str

    def build(self, B: int, T: int, H: int, K: int, V: int) -> dict:
        return self.spec.make_inputs(B, T, H, K, V, variant=self.variant, seed=T)


def _bare_kernels_package() -> None:
    """Register `kernels` as an empty package so each op folder imports on its own, without
    kernels/__init__.py (which imports every op at once)."""
    package = types.ModuleType("kernels")
    package.__path__ = [str(ROOT / "kernels")]
    sys.modules["kernels"] = package


def _specs() -> tuple[list[OpSpec], dict[str, str]]:
    """Every registered op's spec (kernels.registry), or where some op folder fails to import,
    the specs of each kernels/<op>/spec.py that does, and why the others did not."""
    try:
        from kernels.registry import SPECS

        return list(SPECS.values()), {}
    except Exception as err:  # noqa: BLE001 - any failure of an op folder must not stop the others
        print(f"note: the op registry failed to import ({type(err).__name__}: {err}); importing op folders one by one")
    _bare_kernels_package()
    from kernels.common.spec import OpSpec

    specs, skipped = [], {}
    for path in sorted((ROOT / "kernels").glob("*/spec.py")):
        module = f"kernels.{path.parent.name}.spec"
        try:
            found = vars(importlib.import_module(module)).values()
        except Exception as err:  # noqa: BLE001
            skipped[module] = f"{type(err).__name__}: {err}"
            print(f"skip {module}: cannot import it ({skipped[module]})")
            continue
        specs += [value for value in found if isinstance(value, OpSpec)]
    return specs, skipped


def load_ops(labels: list[str] | None) -> tuple[list[tuple[Case, Callable]], dict[str, str]]:
    """(case, public function) of every op variant with a reference and a torch backend
    (restricted to `labels`: a label or an op name), and why others were skipped."""
    specs, skipped = _specs()
    from kernels.common.spec import load_entry

    loaded = []
    for spec in specs:
        if not {"reference", "torch"} <= set(spec.backend_names):
            continue
        for variant in spec.variants:
            label = spec.name if len(spec.variants) == 1 else f"{spec.name}[{variant}]"
            if labels and label not in labels and spec.name not in labels:
                continue
            try:
                loaded.append((Case(label, spec, variant), load_entry(spec.function)))
            except Exception as err:  # noqa: BLE001
                skipped[label] = f"{type(err).__name__}: {err}"
                print(f"skip {label}: cannot import {spec.function} ({skipped[label]})")
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
            tensors = spec.build(args.B, T, args.H, args.K, args.V)
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
