"""Save and load a MixerLM with everything needed to rebuild it: mixer name, vocabulary,
model config, tokenizer info and provenance (the task and config that trained it).

One file, written by torch.save and read with `weights_only=True` (plain containers and
tensors only: loading a checkpoint never runs code from it). Written to a temporary file
and renamed into place, so a crash never leaves half a checkpoint."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tasks.common.model import MixerLM, ModelConfig

FORMAT = "harness.checkpoint/1"
CHECKPOINT_FILE = "checkpoint.pt"


@dataclass
class Checkpoint:
    """A loaded checkpoint: the model (in eval mode) and what describes it.

    tokenizer: a tokenizer `info()` dict (tasks.lm_data.tokenizer_from_info rebuilds it);
    meta: provenance, e.g. {"task": "lm", "task_config": {...}, "seed": 0, "max_length": 128}."""

    model: MixerLM
    tokenizer: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None

    @property
    def mixer(self) -> str:
        return self.model.mixer_name


def save_checkpoint(path: str | Path, model: MixerLM, tokenizer: dict[str, Any], meta: dict[str, Any] | None = None) -> Path:
    """Write `model` (weights on the CPU) with its tokenizer info and JSON-able meta; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": FORMAT,
        "mixer": model.mixer_name,
        "vocab_size": model.vocab_size,
        "max_positions": model.max_positions,
        "model_config": model.config.model_dump(mode="json"),
        "tokenizer": dict(tokenizer),
        "meta": dict(meta or {}),
        "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
    }
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        torch.save(payload, tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it owner-only; give it a normal file's mode
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def resolve_checkpoint_path(path: str | Path) -> Path:
    """A checkpoint file, a folder holding checkpoint.pt, or a run record <run_id>.json whose
    artifact folder holds one."""
    path = Path(path).expanduser()
    if path.suffix == ".json" and path.is_file():
        path = path.with_suffix("")
    if path.is_dir():
        path = path / CHECKPOINT_FILE
    if not path.is_file():
        raise ValueError(
            f"checkpoint {str(path)!r} does not exist; give a checkpoint file, a folder holding {CHECKPOINT_FILE} "
            "or a run record (.json) whose run saved one (e.g. results/runs/lm/<run_id>.json)"
        )
    return path


def load_checkpoint(path: str | Path, device: torch.device | str = "cpu") -> Checkpoint:
    """Rebuild the MixerLM of a checkpoint on `device`, in eval mode."""
    path = resolve_checkpoint_path(path)
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file gets one clear message
        raise ValueError(f"checkpoint {str(path)!r} cannot be read as a harness checkpoint: {e}") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        found = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
        raise ValueError(f"checkpoint {str(path)!r} has format {found!r}; expected {FORMAT!r}")
    model = MixerLM(payload["mixer"], int(payload["vocab_size"]), ModelConfig(**payload["model_config"]),
                    max_positions=int(payload.get("max_positions", 0)))
    model.load_state_dict(payload["state_dict"])
    model.to(device).eval()
    return Checkpoint(model=model, tokenizer=payload["tokenizer"], meta=payload["meta"], path=path)
