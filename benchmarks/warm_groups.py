"""The (mixer, d_model) compile groups of the next runs a sweep would start, for
benchmarks/h200_mqar.sh's WARM=auto.

    python -m benchmarks.warm_groups configs/mqar-paper.yaml --results R --first 4 [--mixer gdn] \
        [--where model.d_model=256] [--key 1a2b3c4d,5e6f7a8b]

Prints "mixer:d_model" once per group, space-separated, for the first `--first` runs of the
selection that have no ok record under R, in the sweep's order (the runs a sweep packing that
many to the GPU starts first; with --key, in the order of the keys). Prints nothing when every
run is done.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.sweep import SweepError, SweepPoint, expand, key_records, load_sweep, select_keys, select_where


def next_groups(sweep_file: Path, results: Path, first: int, mixers: list[str] | None = None,
                where: list[str] | None = None, device_type: str = "cuda",
                keys: list[str] | None = None) -> list[str]:
    """["mixer:d_model", ...] of the first `first` runs still to run, each group once, in order
    (the selection as `harness sweep --mixer --where --key` makes it)."""
    plan = expand(load_sweep(sweep_file), device_type, None, mixers)
    if where:
        plan = select_where(plan, where)
    if keys:
        plan = select_keys(plan, keys)
    todo = [p for p in plan.points if not key_records(results, p).ok][:first]
    groups = [f"{p.mixer}:{p.config['model']['d_model']}" for p in todo]
    return list(dict.fromkeys(groups))


def group_point(sweep_file: Path, mixer: str, d_model: int, device_type: str = "cuda") -> SweepPoint:
    """The sweep's first run of `mixer` at `d_model`: its preset and overrides are what every run
    of the group compiles (they differ in lr and seed, which the graphs do not see)."""
    for point in expand(load_sweep(sweep_file), device_type, None, [mixer]).points:
        if point.config["model"]["d_model"] == d_model:
            return point
    raise SweepError(f"{sweep_file} has no run of {mixer} at d_model {d_model}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep", type=Path)
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--first", type=int, default=4, help="how many of the runs still to run")
    parser.add_argument("--mixer", default=None, help="only these mixers (comma-separated), as harness sweep")
    parser.add_argument("--where", action="append", default=None, help="KEY=VALUE, as harness sweep (repeatable)")
    parser.add_argument("--key", default=None, help="run-key prefixes (comma-separated), as harness sweep")
    args, _ = parser.parse_known_args()  # the rest of a sweep's options (SWEEP_ARGS) do not select

    def names(text: str | None) -> list[str] | None:  # a comma-separated option, as harness sweep reads it
        return [t.strip() for t in text.split(",") if t.strip()] if text else None

    try:
        print(" ".join(next_groups(args.sweep, args.results, args.first, names(args.mixer), args.where,
                                   keys=names(args.key))))
    except SweepError as e:
        sys.exit(f"warm_groups: {e}")


if __name__ == "__main__":
    main()
