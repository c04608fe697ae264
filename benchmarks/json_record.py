"""save_record: how the benchmark scripts that are no run of a task (profiles, summaries) write
their JSON; kernel timings are run records of the kernels task (tasks/kernels.py)."""

from __future__ import annotations

import json
import os


def save_record(record: dict, path: str) -> None:
    """Write `record` as JSON to `path` and, on a device machine (OUT set), a copy to
    $OUT/<same name>; benchmarks call it after every measurement so a cut run keeps them."""
    paths = [path] + ([os.path.join(os.environ["OUT"], os.path.basename(path))] if os.environ.get("OUT") else [])
    for target in dict.fromkeys(paths):
        os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
        tmp = f"{target}.tmp"  # renamed into place: a reader never sees half a record
        with open(tmp, "w") as f:
            json.dump(record, f, indent=1)
            f.write("\n")
        os.replace(tmp, target)
