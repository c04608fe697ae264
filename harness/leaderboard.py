"""Leaderboard tables derived only from run records: the best run per mixer within each
task setting (same task, preset, device and setting fields, and one table per value of the
task's board_split fields), with the config that got it."""

from __future__ import annotations

import hashlib
import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.records import RunRecord, device_type_of, load_records
from tasks.base import Task, learned_metrics
from tasks.registry import UnknownTaskError, get_task


@dataclass
class Board:
    """One table: a task setting and its best run per mixer."""

    task: str
    preset: str
    device: str
    setting: str  # hash of the setting fields, then the board_split values ("a55e584a · d_model 64")
    metric: str
    higher_is_better: bool
    columns: list[str]
    rows: list[dict[str, Any]] = field(default_factory=list)

    def key_columns(self, most: int = 4) -> list[str]:
        """The columns a narrow terminal shows: the ranking metric and the task's shown metrics."""
        shown = [c for c in self.columns if c == self.metric or not c.startswith(f"{self.metric}_")]
        return shown[:most]

    @property
    def title(self) -> str:
        return f"{self.task} · preset {self.preset} · {self.device} · setting {self.setting}"


def _split_label(task: type[Task], config: dict[str, Any]) -> tuple[tuple, str]:
    """(sort key, label) of a record's values of the task's board_split fields: numbers in
    numeric order, the label as 'd_model 64'."""
    flat = flatten_config(config) if task.board_split else {}
    values = [flat.get(f) for f in task.board_split]
    key = tuple((not isinstance(v, (int, float)), v if isinstance(v, (int, float)) else 0, str(v)) for v in values)
    return key, " · ".join(f"{f.rsplit('.', 1)[-1]} {v}" for f, v in zip(task.board_split, values))


def _task_meta(name: str) -> type[Task]:
    try:
        return get_task(name)
    except UnknownTaskError:
        return Task  # a task no longer registered: default ranking


def _learned(record: RunRecord, task: type[Task]) -> float | None:
    """The record's `learned`, or for a record written before it existed, derived the same way
    from its final loss and config; None when neither is possible."""
    if "learned" in record.metrics:
        return record.metrics["learned"]
    try:
        config = task.Config(**record.config)
    except Exception:  # noqa: BLE001 - an old record of a changed task: no verdict
        return None
    return learned_metrics(task, config, record.metrics).get("learned")


def flatten_config(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested config dicts as one level of dotted keys: {"a": {"b": 1}} -> {"a.b": 1}."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(flatten_config(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _config_summary(record: RunRecord, task: type[Task]) -> str:
    """The tuned part of the config: fields that differ from the preset's resolved defaults."""
    flat = flatten_config({k: v for k, v in record.config.items() if k not in task.setting_fields})
    try:
        base = task.Config(**task.presets.get(record.preset, {})).model_dump(mode="json")
        base_flat = flatten_config({k: v for k, v in base.items() if k not in task.setting_fields})
    except Exception:  # noqa: BLE001 - an old record of a changed task: show everything
        base_flat = {}
    diff = {k: v for k, v in flat.items() if base_flat.get(k, object()) != v}
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(diff.items())) or "preset"


def build_boards(results: Path) -> tuple[list[Board], int]:
    """Boards from every ok record under `results`; also returns the number of records read."""
    groups: dict[tuple, list[tuple[Path, RunRecord]]] = defaultdict(list)
    count = 0
    for path, rec in load_records(results):
        count += 1
        if rec.status != "ok":
            continue
        task = _task_meta(rec.task)
        setting = {k: rec.config.get(k) for k in task.setting_fields}
        skey = hashlib.sha256(json.dumps(setting, sort_keys=True, default=str).encode()).hexdigest()[:8]
        class_only = task.board_device == "class" and device_type_of(rec.device) == "cpu"
        device = "cpu" if class_only else rec.device
        split_key, split = _split_label(task, rec.config)
        groups[(rec.task, rec.preset, device, skey, split_key, split)].append((path, rec))
    boards = []
    for (task_name, preset, device, skey, _, split), items in sorted(groups.items()):
        task = _task_meta(task_name)
        metric = task.primary_metric
        best: dict[str, tuple[Path, RunRecord]] = {}
        for path, rec in items:
            if metric not in rec.metrics:
                continue
            cur = best.get(rec.mixer)
            better = cur is None or (
                rec.metrics[metric] > cur[1].metrics[metric]
                if task.higher_is_better
                else rec.metrics[metric] < cur[1].metrics[metric]
            )
            if better:
                best[rec.mixer] = (path, rec)
        if not best:
            continue
        shown = [m for m in task.shown_metrics]
        extra = sorted({m for _, r in best.values() for m in r.metrics if m.startswith(f"{metric}_")
                        and (not task.board_metrics or re.fullmatch(task.board_metrics, m))})
        columns = list(dict.fromkeys([metric, *extra, *shown]))  # a shown metric may also be an accuracy_* extra
        setting = f"{skey} · {split}" if split else skey
        board = Board(task_name, preset, device, setting, metric, task.higher_is_better, columns)
        ranked = sorted(best.values(), key=lambda pr: pr[1].metrics[metric], reverse=task.higher_is_better)
        for path, rec in ranked:
            board.rows.append({
                "mixer": rec.mixer, **{c: rec.metrics.get(c) for c in columns}, "backend": rec.backend,
                "learned": _learned(rec, task),
                "config": _config_summary(rec, task), "runs": sum(1 for _, r in items if r.mixer == rec.mixer),
                "record": str(path.relative_to(results)), "commit": (rec.git_commit or "")[:10],
                "date": rec.finished[:10],
            })
        boards.append(board)
    return boards, count


def _fmt(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
            return f"{value:.3g}"
        return f"{value:.4f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def to_markdown(boards: list[Board], count: int, results: Path) -> str:
    lines = [
        "# Leaderboard",
        "",
        f"Derived only from the {count} run records under `{results}/runs` (`harness leaderboard` rebuilds it).",
        "Each table is one task setting on one device; a row is the best run of a mixer there,",
        "ranked by the first metric, with the config that got it (what differs from the preset).",
        "\"(at chance)\": that run's final loss stayed within 10 % of the task's chance loss.",
        "",
    ]
    for b in boards:
        arrow = "higher is better" if b.higher_is_better else "lower is better"
        lines += [f"## {b.title}", "", f"Ranked by `{b.metric}` ({arrow}).", ""]
        header = ["mixer", *b.columns, "backend", "runs", "config", "date", "commit", "record"]
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + "---|" * len(header))
        for row in b.rows:
            mixer = f"{row['mixer']} (at chance)" if row.get("learned") == 0.0 else row["mixer"]
            cells = [mixer, *(_fmt(row[c]) for c in b.columns), row["backend"] or "–", str(row["runs"]),
                     row["config"], row["date"], row["commit"] or "–", f"[json](runs/{row['record'].removeprefix('runs/')})"]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    if not boards:
        lines.append("No successful runs yet: `harness run --mixer softmax,linear --task mqar` makes some.")
    return "\n".join(lines) + "\n"
