"""save_record / save_text: how the scripts that are no run of a task (profiles, error tables,
compile screens, summaries) write their JSON under results/findings/: renamed into place, so
a reader never sees half a file; kernel timings are run records of the kernels task
(tasks/kernels.py)."""

from __future__ import annotations

import json
import os


def save_text(text: str, path: str | os.PathLike) -> None:
    """Write `text` to `path` through a temporary file renamed into place (one of this process's
    own, so that processes writing the same path never write into one temporary file)."""
    target = os.fspath(path)
    os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
    tmp = f"{target}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, target)


def save_record(record: dict, path: str | os.PathLike) -> None:
    """Write `record` as JSON to `path` and, on a device machine (OUT set), a copy to
    $OUT/<same name>; benchmarks call it after every measurement so a cut run keeps them."""
    path = os.fspath(path)
    paths = [path] + ([os.path.join(os.environ["OUT"], os.path.basename(path))] if os.environ.get("OUT") else [])
    for target in dict.fromkeys(paths):
        save_text(json.dumps(record, indent=1) + "\n", target)
