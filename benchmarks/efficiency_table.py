"""Markdown tables of the throughput and memory tasks' records, as the README shows them.

    python -m benchmarks.efficiency_table throughput [--results results] [--device cuda] [--preset gpu]
    python -m benchmarks.efficiency_table memory [--results results] [--device cuda] [--preset gpu]

throughput: per mixer, the length from which it stays faster than softmax attention at the
token budget (op and layer, forward and forward+backward), the decode step's crossover
(layer), and the op's forward+backward time at the largest length with softmax's beside it.
A crossover reads "≤ T" where the mixer is faster from the grid's first length on, "none ≤ T"
where it is not faster at the grid's last length T, "·" where the record has no such points.
memory: per mixer, the layer's and the op's forward+backward peak at the largest length both
it and softmax ran, that peak over softmax's, the largest length that fits, and the decode
state per sequence at that length.

The newest ok record of each mixer counts (one task, device type and preset); softmax's own
record is left out of the rows, as every other record holds softmax's figures measured in the
same process. The last line names the records' devices, commits and versions."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.records import RunRecord, device_type_of, newest_ok

MIB_PER_GIB = 1024.0
# (mode, phase, column title) of each crossover column, as tasks/throughput.py names them
CROSSOVER_COLUMNS = (("op", "fwd", "op fwd"), ("op", "fwdbwd", "op fwd+bwd"), ("layer", "fwd", "layer fwd"),
                     ("layer", "fwdbwd", "layer fwd+bwd"), ("layer", "decode", "decode step (layer)"))


def newest_records(results: Path, task: str, device: str, preset: str) -> dict[str, RunRecord]:
    """mixer -> its newest ok record of `task` on device type `device` at `preset`."""
    return newest_ok(results, key=lambda rec: rec.mixer,
                     keep=lambda rec: rec.task == task and rec.preset == preset and device_type_of(rec.device) == device)


def _grid_end(rec: RunRecord, mode: str, phase: str) -> int | None:
    """The largest T of the record's ok points of (mode, phase), or None."""
    lengths = [p["T"] for p in rec.details.get("points", [])
               if p.get("mode") == mode and p.get("phase") == phase and p.get("status") == "ok"]
    return max(lengths) if lengths else None


def crossover_cell(rec: RunRecord, mode: str, phase: str) -> str:
    """The crossover of one (mode, phase) at the token budget (the decode sweep for decode)."""
    sweep = "decode" if phase == "decode" else "budget"
    found = [c for c in rec.details.get("crossovers", [])
             if c["mode"] == mode and c["phase"] == phase and c["sweep"] == sweep]
    if not found or found[0]["kind"] == "no_data":
        return "·"
    c = found[0]
    if c["kind"] == "below_grid":
        return f"≤ {round(c['T']):,}"
    if c["kind"] == "none":
        end = _grid_end(rec, mode, phase)
        return f"none ≤ {end:,}" if end else "none"
    return f"{round(c['T']):,}"


def _budget_point(rec: RunRecord, mode: str, phase: str, T: int) -> dict | None:
    """The record's point of (mode, phase) at length T of the token-budget sweep, or None."""
    for p in rec.details.get("points", []):
        if (p.get("mode"), p.get("sweep"), p.get("phase"), p.get("T")) == (mode, "budget", phase, T):
            return p
    return None


def _footer(records: list[RunRecord]) -> str:
    """The line under a table: the records' devices, dates, commits and versions."""
    devices = sorted({r.device for r in records})
    commits = sorted({r.git_commit[:7] for r in records})
    versions = sorted({", ".join(f"{k} {v}" for k, v in sorted(r.versions.items())
                                 if k in ("torch", "triton", "fla", "flash_attn") and v) for r in records})
    dates = sorted({r.finished[:10] for r in records})
    return f"{'; '.join(devices)}; {' to '.join(dict.fromkeys([dates[0], dates[-1]]))}; " \
           f"commits {', '.join(commits)}; {'; '.join(versions)}"


def throughput_table(results: Path, device: str, preset: str) -> str:
    """The crossover table of the newest throughput records (module doc)."""
    newest = {m: r for m, r in newest_records(results, "throughput", device, preset).items() if m != "softmax"}
    if not newest:
        return f"no ok throughput records (device {device}, preset {preset}) under {results / 'runs'}"
    ends = {m: _grid_end(r, "op", "fwdbwd") for m, r in newest.items()}
    end = max((e for e in ends.values() if e), default=None)
    soft = [p["softmax_ms"] for r in newest.values() if end
            for p in [_budget_point(r, "op", "fwdbwd", end)] if p and p.get("softmax_ms")]
    low, high = (f"{min(soft):.1f}", f"{max(soft):.1f}") if soft else ("", "")
    soft_note = f" (softmax: {low if low == high else f'{low}-{high}'} ms)" if soft else ""
    title = f"op fwd+bwd at T = {end:,}{soft_note}" if end else "op fwd+bwd"
    # sequences decoded at once, where every record decoded the same number
    batches = {r.config.get("decode_batch_size") or r.config.get("batch_size") for r in newest.values()}
    decode = f"decode step (layer, B = {min(batches):,})" if len(batches) == 1 and None not in batches else None
    titles = [decode if phase == "decode" and decode else name for _, phase, name in CROSSOVER_COLUMNS]
    lines = ["| mixer | " + " | ".join(titles) + f" | {title} |",
             "|---|" + "---|" * (len(CROSSOVER_COLUMNS) + 1)]
    order = sorted(newest, key=lambda m: (newest[m].metrics.get("op_crossover_T_fwdbwd") is None,
                                          newest[m].metrics.get("op_crossover_T_fwdbwd") or 0.0, m))
    for mixer in order:
        rec = newest[mixer]
        cells = [crossover_cell(rec, mode, phase) for mode, phase, _ in CROSSOVER_COLUMNS]
        p = _budget_point(rec, "op", "fwdbwd", end) if end else None
        last = f"{p['ms']:.1f} ms" if p and p.get("status") == "ok" else "·"
        lines.append(f"| {mixer} | " + " | ".join(cells) + f" | {last} |")
    lines += ["", _footer(list(newest.values()))]
    return "\n".join(lines)


def _peak_at(rec: RunRecord, mode: str, T: int) -> float | None:
    prefix = "op_" if mode == "op" else ""
    return rec.metrics.get(f"{prefix}peak_mib@{T}")


def memory_table(results: Path, device: str, preset: str, length: int | None = None) -> str:
    """The memory table of the newest memory records (module doc), at `length` or else the
    largest length at which every row's mixer and softmax have a layer peak."""
    records = newest_records(results, "memory", device, preset)
    soft = records.pop("softmax", None)
    if not records:
        return f"no ok memory records (device {device}, preset {preset}) under {results / 'runs'}"
    common = None
    for rec in ([soft] if soft else []) + list(records.values()):
        lengths = {int(k.split("@")[1]) for k, v in rec.metrics.items() if k.startswith("peak_mib@") and v is not None}
        common = lengths if common is None else common & lengths
    if length is not None and length not in (common or set()):
        return f"not every mixer (and softmax) has a layer peak at T = {length:,}; lengths they share: {sorted(common or [])}"
    if not common:
        return "no length at which every mixer (and softmax) has a layer peak"
    T = length or max(common)
    lines = [f"| mixer | layer peak at T = {T:,} | over softmax | op peak | largest T that fits | decode state |",
             "|---|---|---|---|---|---|"]
    rows = [("softmax", soft)] if soft else []
    rows += sorted(records.items(), key=lambda kv: (_peak_at(kv[1], "layer", T) or 0.0, kv[0]))
    soft_peak = _peak_at(soft, "layer", T) if soft else None
    for mixer, rec in rows:
        peak, op_peak = _peak_at(rec, "layer", T), _peak_at(rec, "op", T)
        ratio = f"{peak / soft_peak:.2f}" if peak and soft_peak else "·"
        fits = rec.metrics.get("max_T_fits")
        state = rec.metrics.get(f"state_bytes@{T}")
        lines.append(f"| {mixer} | {peak / MIB_PER_GIB:.2f} GiB | {ratio} | "
                     + (f"{op_peak / MIB_PER_GIB:.2f} GiB" if op_peak is not None else "·") + " | "
                     + (f"{int(fits):,}" if fits else "·") + " | "
                     + (f"{state / 1e6:.2f} MB" if state is not None else "·") + " |")
    lines += ["", _footer([r for _, r in rows])]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("task", choices=["throughput", "memory"])
    p.add_argument("--results", type=Path, default=Path("results"))
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="device type of the records")
    p.add_argument("--preset", default="gpu", help="the records' preset")
    p.add_argument("--length", type=int, help="memory: the length of the peaks (default: the largest all share)")
    args = p.parse_args()
    if args.task == "throughput":
        print(throughput_table(args.results, args.device, args.preset))
    else:
        print(memory_table(args.results, args.device, args.preset, args.length))


if __name__ == "__main__":
    main()
