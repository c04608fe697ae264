"""Serve the built dashboard folder over HTTP on 127.0.0.1 only (never on other interfaces)."""

from __future__ import annotations

import functools
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HOST = "127.0.0.1"


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass


def serve(directory: Path, port: int = 8000) -> ThreadingHTTPServer:
    """An HTTP server for `directory` bound to 127.0.0.1:`port` (0 picks a free port); the
    caller runs `serve_forever()` and `server_close()`. OSError when the port is taken."""
    if not 0 <= port <= 65535:
        raise ValueError(f"port must be in 0..65535, got {port}")
    handler = functools.partial(_QuietHandler, directory=str(Path(directory).resolve()))
    return ThreadingHTTPServer((HOST, port), handler)
