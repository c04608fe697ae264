"""Quality figures: MQAR accuracy vs model width and vs decode-state size (the recall-memory
trade-off), NIAH heatmaps (context length x needle depth) and fidelity curves (relative
error of the linear ops against softmax by T and logit scale)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from harness.dashboard.common import Figure, Item, axis, best_per_mixer, colour, layout, length_axis, view_menu


def _mqar_setting_text(rec) -> str:
    tests = rec.config.get("test") or []
    pairs = sorted({(s.get("seq_len"), s.get("num_kv_pairs")) for s in tests if isinstance(s, dict)})
    text = ", ".join(f"T={t}/kv={kv}" for t, kv in pairs[:6]) + (" …" if len(pairs) > 6 else "")
    return f"vocab {rec.config.get('vocab_size')}, test {text}" if pairs else ""


def mqar_figures(groups: list[tuple[tuple, list[Item]]]) -> list[Figure]:
    """Per (preset, setting): best accuracy per (mixer, d_model), against d_model and state size."""
    figures = []
    for n, ((preset, _), items) in enumerate(groups):
        best: dict[tuple[str, int], Item] = {}
        for it in items:
            d_model = (it.rec.config.get("model") or {}).get("d_model")
            if d_model is None or "accuracy" not in it.rec.metrics:
                continue
            cur = best.get((it.rec.mixer, d_model))
            if cur is None or it.rec.metrics["accuracy"] > cur.rec.metrics["accuracy"]:
                best[(it.rec.mixer, d_model)] = it
        if not best:
            continue
        by_mixer: dict[str, list[tuple[int, Item]]] = defaultdict(list)
        for (mixer, d_model), it in sorted(best.items()):
            by_mixer[mixer].append((d_model, it))
        sources = [it for _, it in sorted(best.items())]
        setting = _mqar_setting_text(sources[0].rec)
        widths = sorted({d for _, d in best})
        hover = ("d_model=%{customdata[1]}<br>accuracy %{customdata[2]:.3f}<br>state %{customdata[3]:,.0f} floats"
                 "<br>lr %{customdata[4]}")
        for kind, x_of, xaxis in (
            ("d_model", lambda d, it: d,
             axis("model width d_model", log=True, tickvals=widths, ticktext=[str(w) for w in widths])),
            ("state", lambda d, it: it.rec.metrics.get("state_size"),
             axis("decode state (floats per sequence)", log=True, tickformat="~s")),
        ):
            data = []
            for mixer, pts in sorted(by_mixer.items()):
                pts = [(d, it) for d, it in pts if x_of(d, it)]
                if kind == "state":
                    pts.sort(key=lambda p: x_of(*p))
                if not pts:
                    continue
                data.append({
                    "type": "scatter", "mode": "lines+markers", "name": mixer,
                    "x": [x_of(d, it) for d, it in pts], "y": [it.rec.metrics["accuracy"] for _, it in pts],
                    "customdata": [[it.href, d, it.rec.metrics["accuracy"], it.rec.metrics.get("state_size") or 0,
                                    (it.rec.config.get("optim") or {}).get("lr")] for d, it in pts],
                    "line": {"color": colour(mixer)}, "marker": {"size": 8},
                    "hovertemplate": f"<b>{mixer}</b><br>{hover}<extra></extra>",
                })
            if not data:
                continue
            what = "model width" if kind == "d_model" else "decode state size"
            title, sub = f"MQAR accuracy vs {what}", f"preset {preset}" + (f" · {setting}" if setting else "")
            lay = layout(title, xaxis, axis("accuracy", range=[0, 1.05]), subtitle=sub)
            note = ("Best run per (mixer, d_model) over the other settings (learning rate, ...). "
                    if kind == "d_model" else
                    "The recall-memory trade-off: more state buys recall; "
                    "softmax's state is its KV cache at the longest test length. ")
            note += "Click a point to open its record."
            figures.append(Figure(f"mqar-{kind}-{n}", f"{title} · {sub}", data, lay, sources, note))
    return figures


def _mean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def niah_figures(groups: list[tuple[tuple, list[Item]]]) -> list[Figure]:
    """Per (preset, setting): accuracy vs context length per mixer, then one heatmap per mixer."""
    figures = []
    for n, ((preset, _), items) in enumerate(groups):
        best = {m: it for m, it in best_per_mixer(items, "niah").items() if it.rec.details.get("cells")}
        if not best:
            continue
        train_len = next(iter(best.values())).rec.config.get("train_len")
        lines = []
        for mixer, it in best.items():
            tally: dict[tuple[int, str], list[int]] = defaultdict(lambda: [0, 0])
            for c in it.rec.details["cells"]:
                t = tally[(c["seq_len"], c["variant"])]
                t[0], t[1] = t[0] + c.get("correct", 0), t[1] + c.get("answers", 0)
            lengths = sorted({L for L, _ in tally})
            acc = [_mean([h / a if a else None for (L2, _), (h, a) in tally.items() if L2 == L]) for L in lengths]
            lines.append({"type": "scatter", "mode": "lines+markers", "name": mixer, "x": lengths, "y": acc,
                          "customdata": [[it.href] for _ in lengths], "line": {"color": colour(mixer)},
                          "hovertemplate": f"<b>{mixer}</b><br>T=%{{x:,}}<br>accuracy %{{y:.3f}}<extra></extra>"})
        title = "NIAH accuracy vs context length"
        lay = layout(title, length_axis("context length", [x for tr in lines for x in tr["x"]]),
                     axis("accuracy (mean over variants and depths)", range=[0, 1.05]),
                     subtitle=f"preset {preset} · trained at length {train_len} · best run per mixer, as in the table")
        if train_len:
            lay["shapes"] = [{"type": "line", "x0": train_len, "x1": train_len, "yref": "paper", "y0": 0, "y1": 1,
                              "line": {"dash": "dot", "color": "#888"}}]
        figures.append(Figure(f"niah-lines-{n}", title, lines, lay, list(best.values()),
                              "The dotted line is the training length: to its right the model extrapolates."))
        for mixer, it in best.items():
            figures.append(_heatmap(f"niah-{n}-{mixer}", mixer, preset, train_len, it))
    return figures


def _heatmap(fig_id: str, mixer: str, preset: str, train_len: Any, it: Item) -> Figure:
    cells = it.rec.details["cells"]
    lengths = sorted({c["seq_len"] for c in cells})
    depths = sorted({c["depth"] for c in cells})
    variants = list(dict.fromkeys(c["variant"] for c in cells))
    acc = {(c["seq_len"], c["variant"], c["depth"]): c.get("accuracy") for c in cells}
    views = [("all variants (mean)", None), *((v, v) for v in variants)]
    data = []
    for i, (label, variant) in enumerate(views):
        z = [[acc.get((L, variant, d)) if variant else _mean([acc.get((L, v, d)) for v in variants]) for d in depths]
             for L in lengths]
        data.append({
            "type": "heatmap", "name": label, "z": z, "x": [f"{d * 100:g}%" for d in depths], "y": [str(L) for L in lengths],
            "zmin": 0, "zmax": 1, "colorscale": "Viridis", "texttemplate": "%{z:.2f}", "visible": i == 0,
            "colorbar": {"title": {"text": "accuracy"}},
            "hovertemplate": f"<b>{mixer}</b> · {label}<br>T=%{{y}}, depth %{{x}}<br>accuracy %{{z:.3f}}<extra></extra>",
        })
    title = f"NIAH accuracy of {mixer}"
    lay = layout(title, axis("needle depth", type="category"), axis("context length", type="category"), height=400,
                 subtitle=f"preset {preset} · trained at length {train_len} · {it.rec.device} · the table's best run")
    if len(views) > 1:
        shown = [[j == i for j in range(len(views))] for i in range(len(views))]
        lay["updatemenus"] = view_menu([lab for lab, _ in views], shown)
    return Figure(fig_id, title, data, lay, [it], "Accuracy by context length x needle depth; pick a variant in the menu.")


def fidelity_figures(groups: list[tuple[tuple, list[Item]]]) -> list[Figure]:
    """Per (preset, setting): error vs T by logit scale and on trained q, k, v; error vs scale; swap accuracy."""
    figures = []
    for n, ((preset, _), items) in enumerate(groups):
        best = {m: it for m, it in best_per_mixer(items, "fidelity").items() if it.rec.details.get("gaussian")}
        if not best:
            continue
        sources = list(best.values())
        stds = sorted({g["logit_std"] for it in sources for g in it.rec.details["gaussian"]})
        labels, data, view_of = [], [], []
        for view, std in enumerate([*stds, "trained"]):
            labels.append(f"logit std {std:g}" if std != "trained" else "q, k, v of a trained softmax MQAR model")
            for it in sources:
                for op in it.rec.details.get("ops", []):
                    if std == "trained":
                        rows = [r for r in it.rec.details.get("trained", []) if r["op"] == op]
                        layers = sorted({r["layer"] for r in rows})
                        series = [(f"{op} · layer {layer}", [r for r in rows if r["layer"] == layer],
                                   "solid" if layer == 0 else "dot")
                                  for layer in layers]
                    else:
                        points = [g for g in it.rec.details["gaussian"] if g["op"] == op and g["logit_std"] == std]
                        series = [(op, points, "solid")]
                    for name, rows, dash in series:
                        rows = sorted(rows, key=lambda r: r["seq_len"])
                        if not rows:
                            continue
                        data.append({"type": "scatter", "mode": "lines+markers", "name": name, "visible": view == 0,
                                     "x": [r["seq_len"] for r in rows], "y": [r["rel_err"] for r in rows],
                                     "customdata": [[it.href] for _ in rows], "line": {"color": colour(op), "dash": dash},
                                     "hovertemplate": f"<b>{name}</b><br>T=%{{x:,}}<br>rel. error %{{y:.3g}}<extra></extra>"})
                        view_of.append(view)
        title = "Fidelity to causal softmax vs T"
        lay = layout(title, length_axis("sequence length T", [x for tr in data for x in tr["x"]]),
                     axis("||o − o_softmax|| / ||o_softmax||", log=True),
                     subtitle=f"preset {preset} · best run per mixer, as in the table")
        lay["updatemenus"] = view_menu(labels, [[v == i for v in view_of] for i in range(len(labels))])
        figures.append(Figure(f"fidelity-T-{n}", title, data, lay, sources,
                              "Gaussian q, k, v at each logit scale, or the q, k, v that a trained softmax model "
                              "feeds its layers (menu)."))
        figures.append(_fidelity_by_scale(n, preset, sources))
        figures.append(_swap_bars(n, preset, sources))
    return figures


def _fidelity_by_scale(n: int, preset: str, sources: list[Item]) -> Figure:
    data = []
    for it in sources:
        gauss = it.rec.details["gaussian"]
        longest = max(g["seq_len"] for g in gauss)
        for op in it.rec.details.get("ops", []):
            rows = sorted((g for g in gauss if g["op"] == op and g["seq_len"] == longest), key=lambda g: g["logit_std"])
            data.append({"type": "scatter", "mode": "lines+markers", "name": f"{op} (T={longest})",
                         "x": [g["logit_std"] for g in rows], "y": [g["rel_err"] for g in rows],
                         "customdata": [[it.href] for _ in rows], "line": {"color": colour(op)},
                         "hovertemplate": f"<b>{op}</b><br>logit std %{{x}}<br>rel. error %{{y:.3g}}<extra></extra>"})
    title = "Fidelity vs logit scale at the longest T"
    lay = layout(title, axis("std of the logits q'·k", log=True), axis("relative error", log=True), subtitle=f"preset {preset}")
    return Figure(f"fidelity-scale-{n}", title, data, lay, sources, "Sharper attention (larger logits) is harder to linearise.")


def _swap_bars(n: int, preset: str, sources: list[Item]) -> Figure:
    names, values, colours, custom = [], [], [], []
    for it in sources:
        acc = it.rec.details.get("mqar_accuracy") or {}
        for name, value in acc.items():
            label = f"softmax ({it.rec.mixer} run)" if name == "softmax" else name
            names.append(label), values.append(value), colours.append(colour(name)), custom.append([it.href])
    data = [{"type": "bar", "x": names, "y": values, "marker": {"color": colours}, "customdata": custom,
             "hovertemplate": "%{x}<br>MQAR accuracy %{y:.3f}<extra></extra>", "name": "MQAR accuracy"}]
    title = "MQAR accuracy with softmax swapped for each op"
    lay = layout(title, axis("attention op in the trained model", type="category"), axis("accuracy", range=[0, 1.05]),
                 subtitle=f"preset {preset} · same weights, no retraining", showlegend=False)
    return Figure(f"fidelity-swap-{n}", title, data, lay, sources,
                  "No retraining: the trained softmax model's weights, another op.")
