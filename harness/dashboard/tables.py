"""HTML tables of the page: the leaderboard per task (sortable, filterable, every number a
link to its record), the history of run keys with regressions, failed runs, and the
provenance block under each figure."""

from __future__ import annotations

import re
from collections import defaultdict
from html import escape
from typing import Any, Iterable

from harness.dashboard.common import Figure, Item, fmt_number, provenance, short_commit, versions_text
from harness.dashboard.history import Series
from harness.leaderboard import Board


def _attr(value: Any) -> str:
    return escape(str(value), quote=True)


def _cell(text: str, sort_value: Any, cls: str = "", title: str = "") -> str:
    cls_attr = f' class="{cls}"' if cls else ""
    title_attr = f' title="{_attr(title)}"' if title else ""
    return f'<td{cls_attr} data-v="{_attr(sort_value)}"{title_attr}>{text}</td>'


def _num_cell(value: Any, item: Item | None, title: str = "") -> str:
    if value is None:
        return _cell("–", "", "num")
    text = escape(fmt_number(value))
    if item is not None:
        text = f'<a href="{_attr(item.href)}">{text}</a>'
    return _cell(text, value, "num", title or (f"{value!r} · record {item.rec.run_id}" if item else ""))


def readable(metric: str) -> str:
    """A metric id as a column label: accuracy_kv16 -> "accuracy · kv 16",
    rel_err_lin_gdn_std0p25 -> "rel. error · lin_gdn · std 0.25", peak_mib@512 -> "peak MiB @ 512",
    train_time_s -> "train time s". The id itself stays the column's title (hover)."""
    text = re.sub(r"std(\d+)p(\d+)", r"std\1.\2", metric)
    text = re.sub(r"(?<![a-z])(kv|len|depth|std)(\d)", r"\1 \2", text)
    text = text.replace("@", " @ ").replace("_mib", " MiB").replace("_per_s", "/s")
    for prefix, label in (("rel_err_", "rel. error"), ("accuracy_", "accuracy")):
        if text.startswith(prefix):  # the rest names an op or a setting: kept as written
            return f"{label} · " + text[len(prefix):].replace("_std", " · std").replace("_trained", " · trained")
    return "rel. error" if text == "rel_err" else text.replace("_", " ")


def _table(table_id: str, header: list[tuple[str, ...]], rows: list[str], cls: str = "board") -> str:
    """header: (label, kind[, title]) with kind 'num' or 'text' (how the column sorts); the title
    (the raw metric id) shows on hover."""
    ths = "".join(f'<th data-kind="{h[1]}" tabindex="0"' + (f' title="{_attr(h[2])}"' if len(h) > 2 else "")
                  + f">{escape(h[0])}</th>" for h in header)
    return (f'<div class="table-wrap"><table id="{_attr(table_id)}" class="{cls} sortable">'
            f"<thead><tr>{ths}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>")


def leaderboard_html(boards: list[Board], items_by_rel: dict[str, Item]) -> tuple[str, list[Item]]:
    """One table per task holding the rows of all its boards; and the records it links to."""
    by_task: dict[str, list[Board]] = defaultdict(list)
    for b in boards:
        by_task[b.task].append(b)
    parts, linked = [], []
    for task, task_boards in sorted(by_task.items()):
        columns = list(dict.fromkeys(c for b in task_boards for c in b.columns))
        directions = {b.metric: b.higher_is_better for b in task_boards}
        header = [("rank", "num"), ("mixer", "text"), ("preset", "text"), ("device", "text"), ("setting", "text")]
        header += [(readable(c), "num", c) for c in columns]
        header += [("backend", "text"), ("runs", "num"), ("config", "text"), ("commit", "text"), ("finished", "text")]
        rows = []
        for b in task_boards:
            for rank, row in enumerate(b.rows, 1):
                item = items_by_rel.get(row["record"])
                if item is not None:
                    linked.append(item)
                rec = item.rec if item else None
                attrs = " ".join(f'data-{k}="{_attr(v)}"' for k, v in
                                 (("task", task), ("mixer", row["mixer"]), ("preset", b.preset), ("device", b.device)))
                cells = [_cell(str(rank), rank, "num"), _cell(escape(row["mixer"]), row["mixer"], "mixer"),
                         _cell(escape(b.preset), b.preset), _cell(escape(b.device), b.device),
                         _cell(escape(b.setting), b.setting, "mono")]
                cells += [_num_cell(row.get(c), item) for c in columns]
                commit = short_commit(rec.git_commit) if rec else row.get("commit", "")
                cells += [
                    _cell(escape(row.get("backend") or "–"), row.get("backend") or ""),
                    _cell(str(row["runs"]), row["runs"], "num"),
                    _cell(escape(row["config"]), row["config"], "config"),
                    _cell(escape(commit), commit, "mono", versions_text(rec.versions) if rec else ""),
                    _cell(escape(rec.finished[:16].replace("T", " ")) if rec else "–", rec.finished if rec else ""),
                ]
                rows.append(f"<tr {attrs}>{''.join(cells)}</tr>")
        ranked = ", ".join(f"<code>{escape(m)}</code> ({'higher' if up else 'lower'} is better)" for m, up in directions.items())
        parts.append(
            f'<div class="board-block" data-task="{_attr(task)}"><h3>{escape(task)}</h3>'
            f'<p class="hint">Best run per mixer in each setting (preset, device and setting hash), ranked by {ranked}. '
            f"Click a number to open its record, a column header to sort.</p>"
            + _table(f"board-{task}", header, rows)
            + '<p class="no-match" hidden>No row matches the filters.</p></div>'
        )
    return "".join(parts), linked


def filter_bar(items: Iterable[Item]) -> str:
    """Selects for task, device, mixer and preset (values from the records)."""
    values: dict[str, set[str]] = {"task": set(), "device": set(), "mixer": set(), "preset": set()}
    for it in items:
        for k in values:
            values[k].add(getattr(it.rec, k))
    selects = []
    for k, vals in values.items():
        opts = "".join(f'<option value="{_attr(v)}">{escape(v)}</option>' for v in sorted(vals))
        selects.append(f'<label>{k} <select id="filter-{k}" data-field="{k}">'
                       f'<option value="">all</option>{opts}</select></label>')
    return f'<div class="filters" id="filters">{"".join(selects)}<span id="filter-count"></span></div>'


def history_table(series: list[Series]) -> tuple[str, list[Item]]:
    header = [("status", "text"), ("task", "text"), ("mixer", "text"), ("device", "text"), ("preset", "text"),
              ("config", "text"), ("metric", "text"), ("runs", "num"), ("latest", "num"), ("baseline", "num"),
              ("change", "num"), ("latest run", "text"), ("regressions", "num")]
    rows, linked = [], []
    for s in sorted(series, key=lambda s: (not s.latest.regression, s.task, s.mixer)):
        last = s.latest
        linked.extend(p.item for p in s.points)
        flagged = sum(p.regression for p in s.points)
        status = '<span class="bad">regression</span>' if last.regression else '<span class="good">ok</span>'
        change = "–" if last.change is None else f"{last.change:+.1%}"
        attrs = " ".join(f'data-{k}="{_attr(getattr(s, k))}"' for k in ("task", "mixer", "preset", "device"))
        cls = ' class="regression"' if last.regression else ""
        rows.append(
            f"<tr {attrs}{cls}>" + _cell(status, "0" if last.regression else "1")
            + "".join(_cell(escape(str(v)), v) for v in (s.task, s.mixer, s.device, s.preset))
            + _cell(escape(s.config_hash[:10]), s.config_hash, "mono") + _cell(escape(s.metric), s.metric)
            + _cell(str(len(s.points)), len(s.points), "num") + _num_cell(last.value, last.item)
            + _cell(escape(fmt_number(last.baseline)), last.baseline if last.baseline is not None else "", "num")
            + _cell(change, last.change if last.change is not None else "", "num")
            + _cell(escape(last.item.rec.finished[:16].replace("T", " ")), last.item.rec.finished)
            + _cell(str(flagged), flagged, "num") + "</tr>"
        )
    return _table("history-table", header, rows, "board history"), linked


def regression_banner(series: list[Series], threshold: float) -> str:
    bad = [s for s in series if s.latest.regression]
    if not bad:
        return ""
    lines = "".join(
        f"<li><b>{escape(s.task)}</b> · {escape(s.label)}: {escape(s.metric)} "
        f'<a href="{_attr(s.latest.item.href)}">{escape(fmt_number(s.latest.value))}</a> vs '
        f"{escape(fmt_number(s.latest.baseline))} ({s.latest.change:+.1%})</li>" for s in bad
    )
    return (f'<div class="banner" id="regressions"><b>{len(bad)} regression(s)</b> in the latest nightly runs '
            f"(worse by more than {threshold:.0%} than the median of the previous runs):<ul>{lines}</ul></div>")


def failed_table(items: list[Item]) -> str:
    if not items:
        return ""
    header = [("task", "text"), ("mixer", "text"), ("preset", "text"), ("device", "text"), ("finished", "text"),
              ("error", "text"), ("record", "text")]
    rows = []
    for it in sorted(items, key=lambda it: it.rec.finished, reverse=True):
        r = it.rec
        error = (r.error or "").strip().splitlines()[-1:] or [""]
        attrs = " ".join(f'data-{k}="{_attr(getattr(r, k))}"' for k in ("task", "mixer", "preset", "device"))
        rows.append(f"<tr {attrs}>" + "".join(_cell(escape(v), v) for v in (r.task, r.mixer, r.preset, r.device))
                    + _cell(escape(r.finished[:16].replace("T", " ")), r.finished)
                    + _cell(escape(error[0][:200]), error[0], "config", r.error or "")
                    + _cell(f'<a href="{_attr(it.href)}">{escape(r.run_id)}</a>', r.run_id, "mono") + "</tr>")
    return (f'<details class="failed"><summary>{len(items)} failed run(s)</summary>'
            + _table("failed-table", header, rows) + "</details>")


def provenance_html(fig: Figure) -> str:
    """Device, versions and commit of the records behind a figure, with links to each."""
    prov = provenance(fig.sources)
    summary = (f"<b>device</b> {escape('; '.join(prov['devices']))} · <b>commit</b> {escape(', '.join(prov['commits']))}"
               f" · <b>versions</b> {escape(' | '.join(prov['versions']))}")
    rows = "".join(
        f"<tr><td>{escape(it.rec.task)}</td><td>{escape(it.rec.mixer)}</td><td>{escape(it.rec.device)}</td>"
        f"<td class=\"mono\">{escape(short_commit(it.rec.git_commit))}</td><td>{escape(versions_text(it.rec.versions))}</td>"
        f"<td>{escape(it.rec.finished[:19].replace('T', ' '))}</td>"
        f'<td><a href="{_attr(it.href)}">{escape(it.rec.run_id)}</a></td></tr>'
        for it in fig.sources
    )
    note = f'<p class="note">{escape(fig.note)}</p>' if fig.note else ""
    return (f'{note}<div class="prov">{summary}<details><summary>{len(fig.sources)} record(s)</summary>'
            f"<table class=\"prov-table\"><tr><th>task</th><th>mixer</th><th>device</th><th>commit</th>"
            f"<th>versions</th><th>finished</th><th>record</th></tr>{rows}</table></details></div>")
