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
        table = datasets.load_from_disk(str(path)).data.table
        return {name: _column_array(table.column(name)) for name in table.column_names}
    arrays = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=path.parent))
    try:
        ds = datasets.Dataset.from_dict(dict(arrays))
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


def _column_array(column) -> np.ndarray:
    """A pyarrow column as numpy in its stored dtype: a list column of equal-length rows as
    [rows, width] (one reshape of the flat values; reading rows one by one through `datasets`
    takes longer than generating MQAR's data afresh)."""
    array = column.combine_chunks()
    if not hasattr(array, "offsets"):
        return array.to_numpy(zero_copy_only=False)
    offsets = array.offsets.to_numpy()
    widths = np.diff(offsets)
    if len(widths) and (widths != widths[0]).any():
        return np.array([np.asarray(row) for row in array.to_pylist()], dtype=object)
    flat = array.flatten().to_numpy(zero_copy_only=False)
    return flat.reshape(len(array), int(widths[0]) if len(widths) else 0)
