"""A headless Chromium for the tests that use the UI as a person would: Debian's package,
driven by Playwright (no browser of Playwright's own is downloaded). ``make test`` installs
it; ``CHROMIUM`` names another binary."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from playwright.sync_api import BrowserContext, sync_playwright

__all__ = ["chromium"]

# Without the background-networking flags Chromium keeps calling home, and this machine's
# closed network refuses it many times a second.
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@contextmanager
def chromium() -> Iterator[BrowserContext]:
    binary = Path(os.environ.get("CHROMIUM", "/usr/bin/chromium"))
    assert binary.is_file(), (
        f"no Chromium at {binary}: `make test` installs Debian's chromium (apt-get); "
        "or set CHROMIUM=/path/to/chromium"
    )
    with tempfile.TemporaryDirectory(prefix="mcp-chromium-") as profile, sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            profile,
            executable_path=str(binary),
            headless=True,
            args=FLAGS,
            viewport={"width": 1400, "height": 1000},
        )
        try:
            yield context
        finally:
            context.close()
