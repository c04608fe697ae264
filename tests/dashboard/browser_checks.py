"""The dashboard in headless Chromium (Debian's /usr/bin/chromium driven by Playwright).

Run only by tests/dashboard/test_browser.py, inside a network namespace of its own
(`unshare -n`), where this module brings the loopback interface up: Chromium then cannot
reach anything outside, and the page is checked both from file:// and from the 127.0.0.1
server of `harness dashboard --serve`."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import struct
import threading
from pathlib import Path
from urllib.parse import urlparse

import pytest

if os.environ.get("DASHBOARD_IN_NETNS") != "1":
    pytest.skip("runs inside `unshare -n` only (tests/dashboard/test_browser.py starts it)", allow_module_level=True)

from playwright.sync_api import sync_playwright  # noqa: E402

from harness.dashboard import build_dashboard, serve  # noqa: E402
from harness.leaderboard import build_boards  # noqa: E402
from tests.dashboard.sample_records import Writer, make_sample_results, mqar  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run", "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1"]
RENDERED = ("document.body.dataset.figuresTotal !== undefined"
            " && document.body.dataset.figuresRendered === document.body.dataset.figuresTotal")


def _loopback_up() -> None:
    """A new network namespace starts with `lo` down: set IFF_UP on it (SIOCGIFFLAGS/SIOCSIFFLAGS)."""
    get_flags, set_flags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = fcntl.ioctl(s, get_flags, struct.pack("16sH22x", b"lo", 0))
        flags = struct.unpack("16sH22x", req)[1]
        fcntl.ioctl(s, set_flags, struct.pack("16sH22x", b"lo", flags | iff_up))


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("site")
    results = make_sample_results(root / "results")
    built = build_dashboard(results, root / "out")
    boards, _ = build_boards(results)
    return results, built, boards


@pytest.fixture(scope="module")
def browser():
    _loopback_up()
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


def _watched_page(browser):
    """A page that records console errors, page errors and every request it makes."""
    pg = browser.new_page(viewport={"width": 1400, "height": 1000})
    pg.problems, pg.requests = [], []
    pg.on("console", lambda m: m.type == "error" and pg.problems.append(f"console: {m.text}"))
    pg.on("pageerror", lambda e: pg.problems.append(f"pageerror: {e}"))
    pg.on("request", lambda r: pg.requests.append(r.url))
    return pg


@pytest.fixture
def page(browser):
    pg = _watched_page(browser)
    yield pg
    assert pg.problems == [], pg.problems
    pg.close()


@pytest.fixture(scope="module")
def loaded(browser, site):
    """The sample page from file://, loaded once (5 MB and 20 figures) for the tests that only read or click."""
    _, built, _ = site
    pg = _watched_page(browser)
    _load(pg, built.page.as_uri(), built.figures)
    yield pg
    assert pg.problems == [], pg.problems
    pg.close()


def _load(page, url: str, total: int) -> None:
    page.goto(url)
    page.wait_for_function(RENDERED, timeout=60_000)
    assert page.evaluate("Number(document.body.dataset.figuresTotal)") == total
    assert page.problems == [], page.problems
    for url_seen in page.requests:  # nothing leaves the machine
        assert urlparse(url_seen).scheme in ("file", "data") or urlparse(url_seen).hostname == "127.0.0.1", url_seen


def test_loads_and_every_plot_renders(site, loaded):
    _, built, _ = site
    page = loaded
    plots = page.evaluate("""() => Array.from(document.querySelectorAll('div.plot')).map(el => ({
        id: el.id, rendered: el.dataset.rendered === '1', svg: !!el.querySelector('.main-svg'),
        traces: (el._fullData || []).filter(t => t.visible === true).length,
        drawn: el.querySelectorAll('.scatterlayer .trace, .barlayer .trace, .heatmaplayer .hm, .heatmaplayer image').length}))""")
    assert len(plots) == built.figures
    for p in plots:
        assert p["rendered"] and p["svg"] and p["traces"] > 0 and p["drawn"] > 0, p
    assert page.locator(".empty").count() == 0


def test_view_menu_switches_traces(loaded):
    """The dropdown of a figure shows another view: other traces become visible."""
    page = loaded
    visible = "id => document.getElementById(id)._fullData.filter(t => t.visible === true).map(t => t.index).join()"
    before = page.evaluate(visible, "throughput-0")
    page.click("#throughput-0 .updatemenu-header")
    page.locator("#throughput-0 .updatemenu-dropdown-button").nth(1).click()
    page.wait_for_function(f"([id, before]) => ({visible})(id) !== before", arg=["throughput-0", before])
    after = page.evaluate(visible, "throughput-0")
    assert after and not set(after.split(",")) & set(before.split(","))


def test_tables_hold_the_records_rows(site, loaded, page):
    _, built, boards = site
    page, record_page = loaded, page
    for task in {b.task for b in boards}:
        mixers = page.eval_on_selector_all(f"#board-{task} tbody tr", "rows => rows.map(r => r.dataset.mixer)")
        assert sorted(mixers) == sorted(r["mixer"] for b in boards if b.task == task for r in b.rows), task
    hrefs = page.eval_on_selector_all("table a[href]", "as => as.map(a => a.getAttribute('href'))")
    assert hrefs
    for href in hrefs:
        assert (built.page.parent / href).is_file(), href
    href = page.get_attribute("#board-mqar tbody tr:first-child td.num a", "href")  # a number links to its record
    record_page.goto((built.page.parent / href).as_uri())
    record = json.loads(record_page.inner_text("body"))
    assert record["task"] == "mqar" and record["status"] == "ok"


def test_figures_show_the_tables_best_runs(site, loaded):
    """Each NIAH mixer's line is drawn from the record its table row links to (gdn has a later,
    worse run that must not be drawn), and that row's accuracy is the record's."""
    results, _, boards = site
    page = loaded
    (board,) = [b for b in boards if b.task == "niah"]
    headers = page.eval_on_selector_all("#board-niah thead th", "ths => ths.map(t => t.textContent)")
    col = headers.index("accuracy")
    rows = page.eval_on_selector_all(
        "#board-niah tbody tr", f"rs => rs.map(r => [r.dataset.mixer, r.cells[{col}].querySelector('a').getAttribute('href'),"
        f" r.cells[{col}].dataset.v])")
    drawn = page.evaluate("""() => Object.fromEntries(document.getElementById('niah-lines-0').data
                               .map(t => [t.name, t.customdata[0][0]]))""")
    assert sorted(drawn) == sorted(m for m, _, _ in rows)
    for mixer, href, shown in rows:
        assert drawn[mixer] == href, mixer
        best = next(r for r in board.rows if r["mixer"] == mixer)
        assert float(shown) == pytest.approx(best["accuracy"]) and href.endswith(Path(best["record"]).name)
    gdn = [json.loads(p.read_text()) for p in (results / "runs" / "niah").glob("*-niah-gdn-*.json")]
    assert len(gdn) == 2 and max(gdn, key=lambda r: r["finished"])["metrics"]["accuracy"] < best_accuracy(gdn)


def test_log_ticks_are_labelled_in_full(loaded):
    """Relative errors below 1 on a log axis read 0.3, 0.4, ... (not Plotly's bare 3, 4, ...)."""
    labels = loaded.eval_on_selector_all("#fidelity-T-0 .ytick text", "ts => ts.map(t => t.textContent)")
    assert any(t.startswith("0.") for t in labels), labels
    assert not [t for t in labels if t in list("23456789")], labels


def best_accuracy(records: list[dict]) -> float:
    return max(r["metrics"]["accuracy"] for r in records)


def _column(page, table: str, col: int, numeric: bool) -> list:
    values = page.eval_on_selector_all(f"{table} tbody tr:not([hidden])", f"rs => rs.map(r => r.cells[{col}].dataset.v)")
    return [float(v) for v in values if v != ""] if numeric else [v.lower() for v in values]


def test_sorting(loaded):
    page = loaded
    headers = page.eval_on_selector_all("#board-mqar thead th", "ths => ths.map(t => t.textContent)")
    acc, mixer = headers.index("accuracy"), headers.index("mixer")
    th = page.locator("#board-mqar thead th").nth(acc)
    th.click()
    assert _column(page, "#board-mqar", acc, True) == sorted(_column(page, "#board-mqar", acc, True))
    assert th.get_attribute("aria-sort") == "ascending"
    th.click()
    assert _column(page, "#board-mqar", acc, True) == sorted(_column(page, "#board-mqar", acc, True), reverse=True)
    page.locator("#board-mqar thead th").nth(mixer).click()
    assert _column(page, "#board-mqar", mixer, False) == sorted(_column(page, "#board-mqar", mixer, False))


def test_filtering(site, loaded):
    boards = site[2]
    page = loaded
    total = sum(len(b.rows) for b in boards)
    assert page.inner_text("#filter-count") == f"{total} of {total} leaderboard rows shown"
    page.select_option("#filter-mixer", "gdn")
    visible = page.eval_on_selector_all("table.sortable tbody tr:not([hidden])", "rs => rs.map(r => r.dataset.mixer)")
    assert visible and set(visible) == {"gdn"}
    gdn_rows = sum(r["mixer"] == "gdn" for b in boards for r in b.rows)
    assert page.inner_text("#filter-count") == f"{gdn_rows} of {total} leaderboard rows shown"
    page.select_option("#filter-device", "NVIDIA H200")
    page.select_option("#filter-task", "memory")
    blocks = page.eval_on_selector_all(".board-block", "bs => bs.filter(b => !b.hidden).map(b => b.dataset.task)")
    assert blocks == ["memory"]
    rows = page.eval_on_selector_all("#board-memory tbody tr:not([hidden])",
                                     "rs => rs.map(r => [r.dataset.mixer, r.dataset.device])")
    assert rows == [["gdn", "NVIDIA H200"]]
    page.select_option("#filter-preset", "default")  # no H200 memory run of preset default
    assert page.locator(".board-block[data-task=memory] .no-match").is_visible()
    for name in ("task", "device", "mixer", "preset"):
        page.select_option(f"#filter-{name}", "")
    assert page.inner_text("#filter-count") == f"{total} of {total} leaderboard rows shown"


def test_regression_flagged(loaded):
    page = loaded
    assert "gdn" in page.inner_text("#regressions")
    flagged = page.eval_on_selector_all("#history-table tr.regression", "rs => rs.map(r => [r.dataset.task, r.dataset.mixer])")
    assert flagged == [["throughput", "gdn"]]
    marks = page.evaluate("document.getElementById('history-throughput').data.filter(t => t.name === 'regression')[0].x.length")
    assert marks == 1


def test_served_from_loopback_with_tasks_missing(tmp_path, page):
    """A site with MQAR records only, served as `harness dashboard --serve` does: the other
    sections say "no records yet", the figures render, the links resolve over HTTP."""
    w = Writer(tmp_path / "results")
    for mixer in ("softmax", "gdn"):
        mqar(w, mixer, 64, 1e-2)
    built = build_dashboard(tmp_path / "results", tmp_path / "out")
    server = serve(built.page.parent, 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        _load(page, f"http://127.0.0.1:{port}/", built.figures)
        for sec in ("throughput", "memory", "niah", "fidelity", "history"):
            assert "records yet" in page.inner_text(f"#{sec} .empty"), sec
        assert page.locator("#mqar div.plot[data-rendered='1']").count() == 2
        href = page.get_attribute("#board-mqar tbody tr:first-child td.num a", "href")
        record = page.evaluate("href => fetch(href).then(r => r.ok ? r.json() : null)", href)  # same origin
        assert record is not None and record["task"] == "mqar" and record["run_id"] in href
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_screenshot(site, loaded):
    _, built, _ = site
    page = loaded
    path = Path(os.environ.get("DASHBOARD_SCREENSHOT") or built.page.parent / "dashboard.png")
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 50_000
    docs = os.environ.get("DASHBOARD_DOCS_SCREENSHOT")
    if docs:  # the README picture: the figures from the Throughput section on, 1400 px wide
        page.set_viewport_size({"width": 1400, "height": 1900})
        page.evaluate("document.getElementById('throughput').scrollIntoView()")
        page.wait_for_timeout(1000)  # responsive plots redraw at the new width
        page.screenshot(path=docs)


def test_figure_script_draws_the_chosen_plots(browser, site, tmp_path):
    """benchmarks/dashboard_figure.py: one PNG of the plots whose label matches, an error naming
    the labels there are when none does."""
    from benchmarks.dashboard_figure import shoot

    _, built, _ = site
    out = tmp_path / "mqar.png"
    assert shoot(browser, built.page, "mqar", "MQAR accuracy vs", out) == 2
    assert out.stat().st_size > 10_000 and out.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match=r"no plot of section 'mqar' has 'preset nosuch'.*MQAR accuracy vs"):
        shoot(browser, built.page, "mqar", "preset nosuch", tmp_path / "none.png")
