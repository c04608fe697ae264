"""Training state saved at every epoch's end, so a run cut short (a device call's time limit, a
crash, Ctrl-C) goes on from its last finished epoch when it is run again.

The harness gives each run a folder keyed by its config hash and device type
(RunContext.resume_dir) and removes it once the run's record is written. What a resumed run
repeats exactly: the weights, the optimiser state, the learning-rate schedule and the order of
the batches. What it does not: dropout masks (the CUDA generator is not restored), so a
resumed run is the same run statistically, not bit for bit; its record says where it resumed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

STATE_FILE = "train_state.pt"
STATE_VERSION = 1


@dataclass
class SavedProgress:
    """Where training stood after an epoch: what a resumed run starts from."""

    epoch: int  # epochs finished
    step: int
    loss: float
    train_time_s: float
    eval_time_s: float
    eval_curve: list[dict[str, float]] = field(default_factory=list)
    stop_reason: str = "epochs"
    graph_steps: int = 0


def save_state(folder: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, gen: torch.Generator,
               total_steps: int, progress: SavedProgress) -> None:
    """Write the training state to folder/STATE_FILE atomically (a temporary file, then a rename)."""
    folder.mkdir(parents=True, exist_ok=True)
    payload = {
        "version": STATE_VERSION, "total_steps": total_steps, "progress": progress.__dict__,
        "model": model.state_dict(), "optimizer": opt.state_dict()["state"], "generator": gen.get_state(),
    }
    tmp = folder / f".{STATE_FILE}.{os.getpid()}.tmp"
    torch.save(payload, tmp)
    os.replace(tmp, folder / STATE_FILE)


def load_state(folder: Path | None, model: torch.nn.Module, opt: torch.optim.Optimizer, gen: torch.Generator,
               total_steps: int, device: torch.device) -> SavedProgress | None:
    """Restore model, optimiser state and batch generator from folder/STATE_FILE; None when there
    is none. Only the optimiser's per-parameter state is loaded: its groups (options, learning
    rates on the device for CUDA graphs) stay as this run built them, and the schedule sets the
    learning rate before every step."""
    if folder is None or not (folder / STATE_FILE).is_file():
        return None
    path = folder / STATE_FILE
    try:
        payload = torch.load(path, map_location=device, weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable state is named, not half-used
        raise ValueError(f"{path}: unreadable training state ({type(e).__name__}: {e}); delete it to start over") from e
    if payload.get("version") != STATE_VERSION or payload.get("total_steps") != total_steps:
        raise ValueError(
            f"{path}: saved for {payload.get('total_steps')} training steps (state version "
            f"{payload.get('version')}), this run has {total_steps} (version {STATE_VERSION}); delete it to start over")
    try:
        model.load_state_dict(payload["model"])
        opt.load_state_dict({"state": payload["optimizer"], "param_groups": opt.state_dict()["param_groups"]})
        gen.set_state(payload["generator"].cpu())
    except (RuntimeError, KeyError, ValueError) as e:  # the model changed since the state was saved
        raise ValueError(f"{path}: this run's model does not take the saved training state ({type(e).__name__}: "
                         f"{str(e)[:200]}); delete it to start over") from e
    return SavedProgress(**payload["progress"])


def clear_state(folder: Path | None) -> None:
    """Remove a run's saved training state (its record is written)."""
    if folder is None:
        return
    for path in (folder / STATE_FILE, *folder.glob(f".{STATE_FILE}.*.tmp")):
        path.unlink(missing_ok=True)
    try:
        folder.rmdir()
    except OSError:
        pass
