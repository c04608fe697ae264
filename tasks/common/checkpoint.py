"""Save and load a MixerLM with everything needed to rebuild it: mixer name, vocabulary,
model config, tokenizer info and provenance (the task and config that trained it).

A checkpoint is a folder in the Hugging Face layout: `model.safetensors` (the weights; tied
ones stored once) and `config.json` (everything else), so tools outside the harness can read
it and loading never runs code from it. It is written under a temporary name and renamed into
place, so a crash never leaves half a checkpoint. Checkpoints of the earlier one-file format
(`checkpoint.pt`, torch.save, read with weights_only=True) still load."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tasks.common.model import MixerLM, ModelConfig

FORMAT = "harness.checkpoint/2"
LEGACY_FORMAT = "harness.checkpoint/1"
CHECKPOINT_FILE = "checkpoint"  # the folder's name next to a run record
LEGACY_FILE = "checkpoint.pt"
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"


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
    """Write `model` as a checkpoint folder at `path` (weights from the CPU, its tokenizer info
    and JSON-able meta); an existing checkpoint there is replaced. Returns the folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    config = {
        "format": FORMAT, "mixer": model.mixer_name, "vocab_size": model.vocab_size,
        "max_positions": model.max_positions, "model_config": model.config.model_dump(mode="json"),
        "tokenizer": dict(tokenizer), "meta": dict(meta or {}),
    }
    from safetensors.torch import save_model  # only where checkpoints are written (tasks import this module)

    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        save_model(model, str(tmp / WEIGHTS_FILE))
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=1) + "\n")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it owner-only; give it a normal folder's mode
        if path.exists():
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def resolve_checkpoint_path(path: str | Path) -> Path:
    """A checkpoint folder (holding config.json), a folder holding one (or a legacy
    checkpoint.pt), a legacy checkpoint file, or a run record <run_id>.json whose artifact folder
    holds one."""
    path = Path(path).expanduser()
    if path.suffix == ".json" and path.is_file():
        record, path = path, path.with_suffix("")
        _check_record(record)
        if not path.is_dir():
            raise ValueError(f"{str(record)!r} has no artifact folder {str(path)!r} beside it: that run saved no "
                             "checkpoint (MQAR saves one with --set save_checkpoint=true)")
    if path.is_dir() and not (path / CONFIG_FILE).is_file():
        for inner in (path / CHECKPOINT_FILE, path / LEGACY_FILE):
            if inner.exists():
                path = inner
                break
    if path.is_dir() and not (path / CONFIG_FILE).is_file():
        raise ValueError(
            f"folder {str(path)!r} holds no checkpoint (no {CONFIG_FILE}, {CHECKPOINT_FILE}/ or {LEGACY_FILE} in it); give "
            f"a checkpoint folder ({CONFIG_FILE} + {WEIGHTS_FILE}), a folder holding one, or a run record (.json) whose "
            "run saved one"
        )
    if not (path.is_file() or (path / CONFIG_FILE).is_file()):
        raise ValueError(
            f"checkpoint {str(path)!r} does not exist; give a checkpoint folder (config.json + {WEIGHTS_FILE}), "
            f"a folder holding one, or a run record (.json) whose run saved one (e.g. results/runs/lm/<run_id>.json)"
        )
    return path


def _check_record(path: Path) -> None:
    """ValueError naming `path` when it cannot be a run record (torn, or JSON that is no object):
    its artifact folder would otherwise be taken on trust."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{str(path)!r} is not a readable run record ({e}); give the record of a run that saved a "
                         "checkpoint, or the checkpoint folder itself") from None
    if not isinstance(data, dict):
        raise ValueError(f"{str(path)!r} is not a readable run record (a JSON {type(data).__name__}, not an object); "
                         "give the record of a run that saved a checkpoint, or the checkpoint folder itself")


def load_checkpoint(path: str | Path, device: torch.device | str = "cpu") -> Checkpoint:
    """Rebuild the MixerLM of a checkpoint on `device`, in eval mode."""
    path = resolve_checkpoint_path(path)
    if path.is_file():
        return _load_legacy(path, device)
    try:
        config = json.loads((path / CONFIG_FILE).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"checkpoint {str(path)!r}: {CONFIG_FILE} cannot be read: {e}") from None
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        found = config.get("format") if isinstance(config, dict) else type(config).__name__
        raise ValueError(f"checkpoint {str(path)!r} has format {found!r}; expected {FORMAT!r}")
    from safetensors.torch import load_model

    model = _build(config)
    try:
        missing, unexpected = load_model(model, str(path / WEIGHTS_FILE), strict=False)
    except Exception as e:  # noqa: BLE001 - any unreadable weights file gets one clear message
        raise ValueError(f"checkpoint {str(path)!r}: {WEIGHTS_FILE} cannot be read: {e}") from None
    if missing or unexpected:
        raise ValueError(f"checkpoint {str(path)!r}: weights do not fit the model "
                         f"(missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]})")
    model.to(device).eval()
    return Checkpoint(model=model, tokenizer=config["tokenizer"], meta=config["meta"], path=path)


def _build(config: dict[str, Any]) -> MixerLM:
    return MixerLM(config["mixer"], int(config["vocab_size"]), ModelConfig(**config["model_config"]),
                   max_positions=int(config.get("max_positions", 0)))


def _load_legacy(path: Path, device: torch.device | str) -> Checkpoint:
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file gets one clear message
        raise ValueError(f"checkpoint {str(path)!r} cannot be read as a harness checkpoint: {e}") from None
    if not isinstance(payload, dict) or payload.get("format") != LEGACY_FORMAT:
        found = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
        raise ValueError(f"checkpoint {str(path)!r} has format {found!r}; expected {LEGACY_FORMAT!r}")
    model = _build(payload)
    model.load_state_dict(payload["state_dict"])
    model.to(device).eval()
    return Checkpoint(model=model, tokenizer=payload["tokenizer"], meta=payload["meta"], path=path)
