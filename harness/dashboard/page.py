"""The page itself: one HTML file with its CSS, script, figure specs and plotly.js inlined,
so it works from file:// and from any static host with no network."""

from __future__ import annotations

import importlib.util
import json
import math
import re
from html import escape
from pathlib import Path
from typing import Any

from harness.dashboard.common import Section
from harness.dashboard.tables import provenance_html

ASSETS = Path(__file__).resolve().parent
_PLACEHOLDER = re.compile(r"\{\{([A-Z_]+)\}\}")


class PlotlyMissingError(RuntimeError):
    pass


def plotly_js() -> tuple[str, str]:
    """(source, version) of plotly.min.js as shipped inside the `plotly` Python package."""
    spec = importlib.util.find_spec("plotly")
    if spec is None or not spec.submodule_search_locations:
        raise PlotlyMissingError("the dashboard inlines plotly.js from the `plotly` Python package: pip install plotly")
    path = Path(next(iter(spec.submodule_search_locations))) / "package_data" / "plotly.min.js"
    if not path.exists():
        raise PlotlyMissingError(f"plotly.min.js not found at {path}; reinstall the `plotly` package")
    source = path.read_text(encoding="utf-8")
    if "</script" in source.lower():  # would end the inline <script> early
        raise PlotlyMissingError(f"{path} contains '</script' and cannot be inlined as is")
    match = re.search(r"plotly\.js v(\d+\.\d+\.\d+)", source[:500])
    return source, match.group(1) if match else "unknown"


def _script_json(obj: Any) -> str:
    """JSON safe inside <script type="application/json">: no '</' can close the element."""
    return json.dumps(obj, separators=(",", ":"), allow_nan=False, default=str).replace("</", "<\\/")


def _section_html(sec: Section) -> str:
    parts = [f'<section id="{escape(sec.sec_id)}" class="section"><h2>{escape(sec.title)}</h2>']
    if sec.intro:
        parts.append(f'<p class="intro">{sec.intro}</p>')
    parts.append(sec.html)
    if not sec.figures and not sec.html:
        parts.append(f'<p class="empty">{sec.empty or "No records yet."}</p>')
    if sec.figures:
        parts.append('<div class="figures">')
        for fig in sec.figures:
            parts.append(f'<figure class="fig"><div class="plot" id="{escape(fig.fig_id)}" '
                         f'aria-label="{escape(fig.title, quote=True)}"></div>'
                         f"<figcaption>{provenance_html(fig)}</figcaption></figure>")
        parts.append("</div>")
    parts.append("</section>")
    return "".join(parts)


def _clean(obj: Any) -> Any:
    """NaN and infinities become null (JSON has neither)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def render(title: str, header_html: str, sections: list[Section]) -> str:
    """The whole page as one string."""
    js, version = plotly_js()
    nav = "".join(f'<a href="#{escape(s.sec_id)}">{escape(s.title)}</a>' for s in sections)
    figures = [f.spec() for s in sections for f in s.figures]
    values = {
        "TITLE": escape(title),
        "STYLE": (ASSETS / "page.css").read_text(encoding="utf-8"),
        "HEADER": header_html + f'<p class="meta">Plots: plotly.js {escape(version)}, inlined (works offline).</p>',
        "NAV": nav,
        "BODY": "".join(_section_html(s) for s in sections),
        "FIGURES": _script_json(_clean(figures)),
        "PLOTLY": js,
        "SCRIPT": (ASSETS / "page.js").read_text(encoding="utf-8"),
    }
    template = (ASSETS / "template.html").read_text(encoding="utf-8")
    # One pass over the template only: inserted text (plotly.js) is never scanned again.
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)
