"""Generated data cached on disk as Hugging Face `datasets`, keyed by the generator's config.

A sweep that asks for the same data again loads it instead of regenerating it. The cache
lives in $HARNESS_CACHE (default ~/.cache/harness); a half-written entry is never read,
because entries are written to a temporary folder and renamed into place."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np


def cache_root() -> Path:
    return Path(os.environ.get("HARNESS_CACHE", Path.home() / ".cache" / "harness"))


def cache_key(spec: dict[str, Any]) -> str:
    """A stable short hash of a JSON-able generator spec."""
    blob = json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:20]


def cached_arrays(kind: str, spec: dict[str, Any], make: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Return the arrays for `spec`, generating and saving them on first use."""
    import datasets

    datasets.disable_progress_bars()  # the harness shows its own progress
    path = cache_root() / kind / cache_key(spec)
    if path.exists():
        ds = datasets.load_from_disk(str(path)).with_format("numpy")
        return {name: np.asarray(ds[name]) for name in ds.column_names}
    arrays = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=path.parent))
    try:
        ds = datasets.Dataset.from_dict({name: list(a) for name, a in arrays.items()})
        ds.save_to_disk(str(tmp))
        (tmp / "spec.json").write_text(json.dumps(spec, indent=1, sort_keys=True))
        try:
            os.rename(tmp, path)
        except OSError:  # another process cached the same spec first: use theirs
            pass
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return arrays
