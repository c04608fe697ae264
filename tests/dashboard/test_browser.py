"""Runs the browser checks (browser_checks.py) in headless Chromium inside a network
namespace of their own (`unshare -n`), since Chromium tries outside connections even when
told not to. Skips, saying why, when Chromium, Playwright, plotly or unshare is missing.

Needs: `apt-get install -y chromium` (Debian's, /usr/bin/chromium) and `pip install
playwright` (never `playwright install`: it downloads a browser of its own)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
INNER = Path(__file__).with_name("browser_checks.py")
REPO = Path(__file__).resolve().parents[2]


def _missing() -> str | None:
    if not CHROMIUM.exists():
        return "no /usr/bin/chromium: apt-get install -y chromium"
    for module, how in (("playwright", "pip install playwright"), ("plotly", "pip install plotly")):
        if importlib.util.find_spec(module) is None:
            return f"no {module} module: {how}"
    if shutil.which("unshare") is None:
        return "no unshare (util-linux): the browser must run without network access"
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"`unshare -n` is not permitted here ({probe.stderr.strip()}); needs root or user namespaces"
    return None


@pytest.mark.skipif(_missing() is not None, reason=str(_missing()))
def test_dashboard_in_headless_chromium(tmp_path):
    shot = tmp_path / "dashboard.png"
    env = {**os.environ, "DASHBOARD_IN_NETNS": "1", "DASHBOARD_SCREENSHOT": str(shot),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    cmd = ["unshare", "-n", sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
           "--basetemp", str(tmp_path / "inner"), str(INNER)]
    run = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    report = run.stdout[-6000:] + run.stderr[-3000:]
    assert run.returncode == 0, report
    assert " passed" in run.stdout and "skipped" not in run.stdout.splitlines()[-1], report
    assert shot.stat().st_size > 50_000
