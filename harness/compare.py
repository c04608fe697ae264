"""Regression gate: compare the metrics of two sets of run records.

Runs are matched by (task, mixer, preset, device, setting), the setting being the task's
`setting_fields` of the config (hashed as the leaderboard does); on each side the newest ok
record of a key is used. For every metric both sides have, ratio = new / base. A metric's
direction comes from its name: times (`*_ms*`, `*_s`), bytes and memory are lower-is-better;
accuracy, tokens/s and TFLOP/s higher-is-better; a count of failures lower-is-better. Other
metrics are shown but not gated. A key that is ok in BASE but only failed in NEW is a
regression too.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path

from harness.records import RunRecord, warn_unreadable

LOWER, HIGHER = "lower", "higher"


class CompareError(ValueError):
    """Inputs that cannot be compared (missing path, no records, bad threshold)."""


def direction(metric: str) -> str | None:
    """'lower' or 'higher' (is better) from the metric's name; None when unknown."""
    name = metric.lower()
    tokens = set(re.split(r"[^a-z0-9]+", name))
    if "accuracy" in tokens or name.startswith("accuracy") or "tokens_per_s" in name or "tflops" in tokens:
        return HIGHER
    if tokens & {"ms", "s", "mib", "gib", "mb", "gb", "failed"} or "bytes" in name or "memory" in name:
        return LOWER
    return None


def parse_threshold(text: str) -> float:
    """'5%', '0.05' or '5' (a bare number >= 1 is a percentage) -> 0.05."""
    raw = text.strip()
    try:
        value = float(raw.rstrip("%"))
    except ValueError:
        raise CompareError(f"--threshold {text!r} is not a number; give e.g. 5% or 0.05") from None
    fraction = value / 100 if raw.endswith("%") or value >= 1 else value
    if not 0 <= fraction < 10 or math.isnan(fraction):
        raise CompareError(f"--threshold {text!r} is out of range; give a percentage such as 5%")
    return fraction


RunKey = tuple[str, str, str, str, str]  # task, mixer, preset, device, setting hash


def run_key(rec: RunRecord) -> RunKey:
    from tasks import UnknownTaskError, get_task

    try:
        fields = get_task(rec.task).setting_fields
    except UnknownTaskError:
        fields = ()
    setting = {k: rec.config.get(k) for k in fields}
    skey = hashlib.sha256(json.dumps(setting, sort_keys=True, default=str).encode()).hexdigest()[:8]
    return rec.task, rec.mixer, rec.preset, rec.device, skey


@dataclass
class Side:
    """The newest ok and newest failed record per key found under one path."""

    ok: dict[RunKey, RunRecord] = field(default_factory=dict)
    failed: dict[RunKey, RunRecord] = field(default_factory=dict)
    count: int = 0


def load_side(path: Path) -> Side:
    """Records from a results directory (any folder holding record JSON files) or one file."""
    path = Path(path)
    if not path.exists():
        raise CompareError(f"{path} does not exist; give a results directory or a record file")
    files = [path] if path.is_file() else sorted(path.rglob("*.json"))
    side = Side()
    for f in files:
        try:
            rec = RunRecord.model_validate_json(f.read_text())
        except (ValueError, OSError) as e:
            if f == path:
                reason = str(e).splitlines()[0] if str(e) else type(e).__name__
                raise CompareError(f"{path} is not a readable run record ({reason})") from None
            if f.parent.parent.name == "runs":  # where records live: say so; artifacts pass quietly
                warn_unreadable(f, e)
            continue
        side.count += 1
        book = side.ok if rec.status == "ok" else side.failed
        key = run_key(rec)
        if key not in book or (rec.finished, rec.run_id) > (book[key].finished, book[key].run_id):
            book[key] = rec
    if side.count == 0:
        raise CompareError(f"no run records under {path}")
    return side


@dataclass
class Row:
    key: RunKey
    metric: str
    base: float | None
    new: float | None
    ratio: float | None
    direction: str | None
    verdict: str  # regression, improved, ok, not gated, failed


@dataclass
class Comparison:
    rows: list[Row]
    threshold: float
    only_base: list[RunKey]
    only_new: list[RunKey]
    base_count: int
    new_count: int

    @property
    def regressions(self) -> list[Row]:
        return [r for r in self.rows if r.verdict in ("regression", "failed")]


def _judge(base: float, new: float, way: str | None, threshold: float) -> tuple[float | None, str]:
    if not (math.isfinite(base) and math.isfinite(new)):
        if way is None:
            return None, "not gated"
        # a gated metric that became NaN or infinite is broken; one that was already is not news
        return None, "regression" if math.isfinite(base) else "ok"
    ratio = new / base if base != 0 else (1.0 if new == 0 else math.copysign(math.inf, new))
    if way is None:
        return ratio, "not gated"
    if (way == LOWER and ratio > 1 + threshold) or (way == HIGHER and ratio < 1 - threshold):
        return ratio, "regression"
    if (way == LOWER and ratio < 1 - threshold) or (way == HIGHER and ratio > 1 + threshold):
        return ratio, "improved"
    return ratio, "ok"


def compare(base_path: Path, new_path: Path, threshold: float, ignore: list[str] | None = None) -> Comparison:
    """Match runs of two record sets and judge every common metric (see the module doc)."""
    base, new = load_side(base_path), load_side(new_path)
    rows: list[Row] = []
    for key in sorted(base.ok.keys() & (new.ok.keys() | new.failed.keys())):
        b = base.ok[key]
        if key not in new.ok:
            rows.append(Row(key, "status", None, None, None, None, "failed"))
            continue
        n = new.ok[key]
        for metric in sorted(b.metrics.keys() & n.metrics.keys()):
            way = None if any(fnmatch(metric, pat) for pat in ignore or []) else direction(metric)
            ratio, verdict = _judge(b.metrics[metric], n.metrics[metric], way, threshold)
            rows.append(Row(key, metric, b.metrics[metric], n.metrics[metric], ratio, way, verdict))
    only_base = sorted(base.ok.keys() - new.ok.keys() - new.failed.keys())
    only_new = sorted(new.ok.keys() - base.ok.keys())
    return Comparison(rows, threshold, only_base, only_new, base.count, new.count)


def fmt_value(v: float | None) -> str:
    if v is None:
        return "–"
    if v != 0 and math.isfinite(v) and (abs(v) >= 1e5 or abs(v) < 1e-3):
        return f"{v:.3g}"
    return f"{v:.4g}"


def fmt_change(r: Row) -> str:
    if r.ratio is None:
        return "–"
    if math.isinf(r.ratio):
        return "+inf%"
    return f"{(r.ratio - 1) * 100:+.1f}%"


def to_markdown(c: Comparison, changed_only: bool = False) -> str:
    """The comparison as a Markdown report (what the nightly job publishes)."""
    lines = [
        "# Comparison", "",
        (f"{len(c.regressions)} regression(s) beyond {c.threshold:.1%}; {c.base_count} base and {c.new_count} new "
         f"record(s); {len(c.only_base)} run(s) only in base, {len(c.only_new)} only in new."), "",
        "| task | mixer | preset | device | setting | metric | base | new | change | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in c.rows:
        if changed_only and r.verdict not in ("regression", "improved", "failed"):
            continue
        lines.append("| " + " | ".join([*r.key, r.metric, fmt_value(r.base), fmt_value(r.new), fmt_change(r), r.verdict]) + " |")
    return "\n".join(lines) + "\n"
