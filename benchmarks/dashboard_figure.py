"""A PNG of some of the dashboard's figures, drawn from the run records by `harness dashboard`
and rendered in headless Chromium (Debian's /usr/bin/chromium through Playwright, as the
dashboard's browser tests), for the README where a picture reads faster than a table.

    unshare -rn python -m benchmarks.dashboard_figure --results results \\
        --section mqar --label "preset zoology" --out docs/mqar_zoology.png

Takes the plots of one section (`--section`, the page's section id) whose label contains
`--label`, and writes one image of the region that holds them all. The page loads from
file:// with plotly inlined; run it in a network namespace of its own (`unshare -rn`) so that
Chromium cannot reach anything outside.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
RENDERED = ("document.body.dataset.figuresTotal !== undefined"
            " && document.body.dataset.figuresRendered === document.body.dataset.figuresTotal")


def render(page_path: Path, section: str, label: str, out: Path, width: int = 1400) -> int:
    """Screenshot the plots of `section` whose aria-label contains `label` into `out`, in a
    Chromium of its own; returns how many plots the image holds (shoot says more)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            return shoot(browser, page_path, section, label, out, width)
        finally:
            browser.close()


def shoot(browser, page_path: Path, section: str, label: str, out: Path, width: int = 1400) -> int:
    """render in a running Playwright browser. ValueError naming the labels found when no plot
    of the section matches."""
    page = browser.new_page(viewport={"width": width, "height": 1000})
    try:
        page.goto(page_path.resolve().as_uri())
        page.wait_for_function(RENDERED, timeout=120_000)
        plots = page.locator(f"#{section} div.plot")
        labels = [plots.nth(i).get_attribute("aria-label") or "" for i in range(plots.count())]
        chosen = [i for i, text in enumerate(labels) if label in text]
        if not chosen:
            raise ValueError(f"no plot of section {section!r} has {label!r} in its label; it has: {labels}")
        boxes = []
        for i in chosen:
            plots.nth(i).scroll_into_view_if_needed()
            boxes.append(plots.nth(i).bounding_box())
        scroll = page.evaluate("[window.scrollX, window.scrollY]")
        left, top = min(b["x"] for b in boxes), min(b["y"] for b in boxes)
        right, bottom = max(b["x"] + b["width"] for b in boxes), max(b["y"] + b["height"] for b in boxes)
        out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(out), full_page=True, clip={
            "x": left + scroll[0], "y": top + scroll[1], "width": right - left, "height": bottom - top})
    finally:
        page.close()
    return len(chosen)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=Path("results"), help="results directory (its run records)")
    ap.add_argument("--section", default="mqar", help="the dashboard section's id (mqar, niah, throughput, ...)")
    ap.add_argument("--label", default="", help="only the plots whose label contains this text")
    ap.add_argument("--out", type=Path, required=True, help="the PNG to write")
    args = ap.parse_args()
    if not Path(CHROMIUM).exists():
        sys.exit(f"dashboard_figure: {CHROMIUM} is missing (Debian's chromium package)")
    from harness.dashboard import build_dashboard

    with tempfile.TemporaryDirectory() as tmp:
        built = build_dashboard(args.results, Path(tmp) / "site")
        try:
            n = render(built.page, args.section, args.label, args.out)
        except ValueError as e:
            sys.exit(f"dashboard_figure: {e}")
    print(f"{args.out}: {n} plot(s) of section {args.section} from {built.figures} figure(s)")


if __name__ == "__main__":
    main()
