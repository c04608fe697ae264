"""wandb logging: every run logs its config and metrics.

Offline by default, so it works with no account and no network; online only when the user
has configured wandb (WANDB_MODE=online, or an API key in WANDB_API_KEY or ~/.netrc).
WANDB_MODE set by the user always wins. `--no-wandb` turns logging off."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def wandb_mode() -> str:
    """'online', 'offline' or 'disabled', from the user's environment."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    netrc = Path.home() / ".netrc"
    try:
        if "api.wandb.ai" in netrc.read_text():
            return "online"
    except OSError:
        pass
    return "offline"


class Tracker:
    """One wandb run per harness run (a no-op when disabled)."""

    def __init__(self, enabled: bool, project: str = "mixer-harness"):
        self.enabled = enabled
        self.project = project
        self._run = None

    def start(self, name: str, group: str, config: dict[str, Any], tags: list[str]) -> None:
        if not self.enabled:
            return
        import wandb

        self._run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", self.project), name=name, group=group, config=config,
            tags=tags, mode=wandb_mode(), reinit="finish_previous",
            settings=wandb.Settings(silent=True, console="off", x_disable_stats=True),
        )

    def log(self, metrics: dict[str, float], step: int | None = None) -> None:
        if self._run is not None:
            self._run.log(metrics, step=step)

    def finish(self, summary: dict[str, Any], failed: bool) -> str | None:
        """Write the final metrics into the run summary; returns the run's local folder."""
        if self._run is None:
            return None
        for key, value in summary.items():
            self._run.summary[key] = value
        folder = self._run.dir
        self._run.finish(exit_code=1 if failed else 0)
        self._run = None
        return folder
