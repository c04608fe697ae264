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


def table_rows(value: Any) -> list[dict[str, Any]] | None:
    """A details entry as table rows when it is a list of flat dicts (per-T timings, eval
    curves); None otherwise."""
    if not isinstance(value, list) or not value or not all(isinstance(row, dict) for row in value):
        return None
    scalar = (int, float, str, bool, type(None))
    if not all(isinstance(v, scalar) for row in value for v in row.values()):
        return None
    return value


class Tracker:
    """One wandb run per harness run (a no-op when disabled).

    log_every: steps between logged training points (the tasks read it through RunContext)."""

    def __init__(self, enabled: bool, project: str = "mixer-harness", log_every: int = 50):
        if log_every < 1:
            raise ValueError(f"log_every must be >= 1, got {log_every}")
        self.enabled = enabled
        self.project = project
        self.log_every = log_every
        self._run = None

    def start(self, name: str, group: str, config: dict[str, Any], tags: list[str],
              job_type: str | None = None) -> dict[str, str] | None:
        """Open the run; returns its id, path (entity/project/id) and local folder, or None when disabled."""
        if not self.enabled:
            return None
        import wandb

        self._run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", self.project), name=name, group=group, config=config,
            tags=tags, job_type=job_type, mode=wandb_mode(), reinit="finish_previous",
            # wandb keeps the first run's settings for the process; the folder is read each run
            dir=os.environ.get("WANDB_DIR") or None,
            settings=wandb.Settings(silent=True, console="off", x_disable_stats=True),
        )
        return {"id": self._run.id, "path": str(self._run.path), "dir": str(Path(self._run.dir).parent)}

    def log(self, metrics: dict[str, float], step: int | None = None) -> None:
        if self._run is not None:
            self._run.log(metrics, step=step)

    def log_outputs(self, images: list[Path], tables: dict[str, list[dict[str, Any]]]) -> None:
        """Plots as wandb.Image under plots/<name>, row lists as wandb.Table under tables/<name>."""
        if self._run is None:
            return
        import wandb

        logged: dict[str, Any] = {f"plots/{path.stem}": wandb.Image(str(path)) for path in images}
        for name, rows in tables.items():
            columns = list(dict.fromkeys(k for row in rows for k in row))
            logged[f"tables/{name}"] = wandb.Table(columns=columns, data=[[row.get(c) for c in columns] for row in rows])
        if logged:
            self._run.log(logged, commit=True)

    def log_record(self, record_path: Path, run_id: str, checkpoint: Path | None = None) -> None:
        """The run record as an Artifact (type run-record), and the checkpoint folder as one of type model."""
        if self._run is None:
            return
        import wandb

        record = wandb.Artifact(f"record-{run_id}", type="run-record")
        record.add_file(str(record_path))
        self._run.log_artifact(record)
        if checkpoint is not None and checkpoint.is_dir():
            model = wandb.Artifact(f"model-{run_id}", type="model")
            model.add_dir(str(checkpoint))
            self._run.log_artifact(model)

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
