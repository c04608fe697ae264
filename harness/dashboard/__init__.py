"""`harness dashboard`: one static, self-contained web page built only from run records."""

from harness.dashboard.build import DEFAULT_THRESHOLD, BuildResult, build_dashboard
from harness.dashboard.serve import serve

__all__ = ["DEFAULT_THRESHOLD", "BuildResult", "build_dashboard", "serve"]
