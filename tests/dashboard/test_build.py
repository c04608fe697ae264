"""The dashboard builder without a browser: the page is self-contained, every link lands on a
copied record, missing tasks say so, regressions are flagged in the worse direction, the
CLI command and the 127.0.0.1 server work."""

from __future__ import annotations

import json
import re
import threading
import urllib.request
from datetime import timedelta

import pytest
import typer
from typer.testing import CliRunner

pytest.importorskip("plotly", reason="the dashboard inlines plotly.js from the plotly package: pip install plotly")

from harness.dashboard import build_dashboard, serve  # noqa: E402
from harness.dashboard.build import collect  # noqa: E402
from harness.dashboard.history import build_series  # noqa: E402
from harness.dashboard_cli import dashboard_cmd  # noqa: E402
from harness.leaderboard import build_boards  # noqa: E402
from tests.dashboard.sample_records import START, Writer, make_sample_results, mqar  # noqa: E402

SECTIONS = ("leaderboard", "throughput", "memory", "mqar", "niah", "fidelity", "history")


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    root = tmp_path_factory.mktemp("dash")
    results = make_sample_results(root / "results")
    built = build_dashboard(results, root / "out")
    return results, built, built.page.read_text()


def _figure_specs(html: str) -> list[dict]:
    blob = re.search(r'<script type="application/json" id="figure-data">(.*?)</script>', html, re.S).group(1)
    return json.loads(blob)


def test_page_is_self_contained(sample):
    _, built, html = sample
    assert built.page.name == "index.html" and built.page.stat().st_size > 1_000_000  # plotly.js inlined
    assert "Plotly" in html and '<link rel="icon" href="data:,">' in html
    markup = re.sub(r"<script>.*?</script>", "", html, flags=re.S)  # the page without its inline scripts
    assert not re.search(r"<script[^>]+src=|<link[^>]+stylesheet|@import|url\(", markup)
    # nothing fetched from a network (the browser test watches requests)
    assert not re.search(r'(src|href)="(https?:)?//', markup)


def test_every_section_and_figure(sample):
    _, built, html = sample
    assert built.warnings == ()
    for sec in SECTIONS:
        assert f'<section id="{sec}"' in html
    assert 'class="empty"' not in html  # the sample has records of every task
    specs = _figure_specs(html)
    assert len(specs) == built.figures >= 15
    for spec in specs:
        assert f'id="{spec["id"]}"' in html and spec["data"], spec["id"]


def test_links_land_on_copied_records(sample):
    results, built, html = sample
    out = built.page.parent
    hrefs = set(re.findall(r'href="(records/[^"]+)"', html))
    hrefs |= {c[0] for s in _figure_specs(html) for t in s["data"] for c in t.get("customdata", [])
              if isinstance(c, list) and isinstance(c[0], str)}
    assert hrefs and len(hrefs) == built.linked
    for href in hrefs:
        copy = out / href
        original = results / "runs" / href.removeprefix("records/")
        assert copy.read_bytes() == original.read_bytes(), href
    assert sorted(p.relative_to(out).as_posix() for p in (out / "records").rglob("*.json")) == sorted(hrefs)


def test_tables_hold_every_board_row(sample):
    results, _, html = sample
    boards, _ = build_boards(results)
    for task in {b.task for b in boards}:
        table = re.search(rf'<table id="board-{task}".*?</table>', html, re.S).group(0)
        expected = sorted(r["mixer"] for b in boards if b.task == task for r in b.rows)
        assert sorted(re.findall(r'<td class="mixer" data-v="([^"]+)"', table)) == expected


def test_regression_flagged_once(sample):
    _, built, html = sample
    assert built.regressions == 1
    banner = re.search(r'<div class="banner" id="regressions">.*?</div>', html, re.S).group(0)
    assert "gdn" in banner and "fwdbwd_tokens_per_s" in banner
    assert html.count('<tr data-task="throughput" data-mixer="gdn"') >= 1
    assert len(re.findall(r'class="regression"', html)) == 1


def test_missing_tasks_say_no_records_yet(tmp_path):
    w = Writer(tmp_path / "results")
    for mixer in ("softmax", "gdn"):
        mqar(w, mixer, 64, 1e-2)
    built = build_dashboard(tmp_path / "results", tmp_path / "out")
    html = built.page.read_text()
    for task in ("throughput", "memory", "niah", "fidelity"):
        assert f"No <code>{task}</code> records yet" in html
    assert "No run key has two records yet" in html
    assert built.figures == 2  # MQAR vs d_model and vs state size


def test_a_record_of_another_shape_spoils_only_its_section(tmp_path):
    w = Writer(tmp_path / "results")
    mqar(w, "gdn", 64, 1e-2)
    point_without_T = {"mode": "layer", "sweep": "budget", "phase": "fwd", "status": "ok"}
    w.write("throughput", "gdn", "tiny", "cpu", {"fwdbwd_tokens_per_s": 1.0}, details={"points": [point_without_T]})
    built = build_dashboard(tmp_path / "results", tmp_path / "out")
    assert len(built.warnings) == 1 and built.warnings[0].startswith("throughput:")
    html = built.page.read_text()
    assert "Could not draw figures from the throughput records" in html
    assert built.figures == 2 and '<table id="board-throughput"' in html


def test_no_records_at_all(tmp_path):
    built = build_dashboard(tmp_path / "results", tmp_path / "out")
    assert built.records == 0 and built.figures == 0
    assert "No run records yet" in built.page.read_text()


def test_regression_direction(tmp_path):
    w = Writer(tmp_path / "results")
    day = timedelta(days=1)
    for i, shift in enumerate([0.0, 0.01, -0.01, 0.3]):  # higher is better: a rise is no regression
        mqar(w, "gdn", 64, 1e-2, when=START + i * day, shift=shift)
    for i, shift in enumerate([0.0, 0.01, 0.0, -0.3]):  # a 30% drop is
        mqar(w, "gla", 64, 1e-2, when=START + i * day, shift=shift)
    series = {s.mixer: s for s in build_series([it for it in collect(tmp_path / "results")], threshold=0.1)}
    assert [p.regression for p in series["gla"].points] == [False, False, False, True]
    assert not any(p.regression for p in series["gdn"].points)
    assert series["gla"].latest.change < -0.1
    with pytest.raises(ValueError, match="threshold"):
        build_series([], threshold=0)


def test_cli_command(tmp_path):
    app = typer.Typer()
    app.command("dashboard")(dashboard_cmd)
    app.command("noop")(lambda: None)  # two commands, so "dashboard" is a subcommand as in harness
    results = tmp_path / "results"
    w = Writer(results)
    mqar(w, "gdn", 64, 1e-2)
    runner = CliRunner()
    out = runner.invoke(app, ["dashboard", "--results", str(results), "--out", str(tmp_path / "site")])
    assert out.exit_code == 0, out.output
    assert (tmp_path / "site" / "index.html").exists() and "figure(s)" in out.output
    default = runner.invoke(app, ["dashboard", "--results", str(results)])
    assert default.exit_code == 0 and (results / "dashboard" / "index.html").exists()
    for args, needle in ((["--port", "9"], "--port needs --serve"), (["--regression-threshold", "0"], "must be > 0"),
                         (["--out", str(results)], "folder of its own")):
        bad = runner.invoke(app, ["dashboard", "--results", str(results), *args])
        assert bad.exit_code == 2 and needle in " ".join(bad.output.split()), bad.output
    missing = runner.invoke(app, ["dashboard", "--results", str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "not a directory" in " ".join(missing.output.split())


def test_serve_on_loopback(sample):
    _, built, _ = sample
    server = serve(built.page.parent, 0)
    host, port = server.server_address[:2]
    assert host == "127.0.0.1"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10).read()
        assert body == built.page.read_bytes()
        first = re.search(r'href="(records/[^"]+)"', body.decode()).group(1)
        record = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/{first}", timeout=10).read())
        assert record["run_id"] in first
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_column_labels_are_readable_and_keep_the_id():
    from harness.dashboard.tables import readable

    assert readable("rel_err_lin_gdn_std0p25") == "rel. error · lin_gdn · std 0.25"
    assert readable("accuracy_kv16") == "accuracy · kv 16" and readable("peak_mib@512") == "peak MiB @ 512"
    assert readable("train_time_s") == "train time s" and readable("accuracy") == "accuracy"


def test_table_headers_show_labels_with_the_metric_id_on_hover(sample):
    _, _, html = sample
    assert 'title="rel_err">rel. error</th>' in html and 'title="swap_accuracy">swap accuracy</th>' in html
