"""What the browser tests share: a Chromium, a quiet local web server, and the skip marker."""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

# scripts/setup.sh (find_chromium) looks for the same names, in the same order.
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "/snap/bin/chromium")
INSTALL_CHROMIUM = (
    "no Chromium found: install it (Debian: scripts/setup.sh --browser or apt-get install chromium; "
    "Ubuntu: snap install chromium) or Chrome, or set CHROMIUM to one"
)
IN_CI = bool(os.environ.get("CI"))


def find_chromium() -> Path | None:
    """The browser the tests drive: ``$CHROMIUM`` when it is set, else the first of ``CHROMIUM_NAMES`` found."""
    wanted = os.environ.get("CHROMIUM")
    for name in (wanted,) if wanted else CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return Path(found)
    return None


CHROMIUM = find_chromium()
# Headless, and no background traffic: this machine's network is closed.
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip

# Without a browser the tests skip with one line saying what to install; under CI they run and fail.
needs_chromium = pytest.mark.skipif(CHROMIUM is None and not IN_CI, reason=INSTALL_CHROMIUM)


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def serve(folder: Path) -> Iterator[str]:
    """Serve ``folder`` on a free loopback port; yields the base address (no trailing slash)."""
    handler = functools.partial(QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def chromium() -> Iterator[object]:
    """A headless Chromium driven by Playwright (skips the test when Playwright is missing)."""
    if CHROMIUM is None:
        pytest.fail(INSTALL_CHROMIUM)
    playwright_api = pytest.importorskip("playwright.sync_api")
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
        try:
            yield browser
        finally:
            browser.close()
