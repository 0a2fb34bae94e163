"""Debian's Chromium, headless, through Playwright: for the dashboard's tests and the docs' screenshot."""

from __future__ import annotations

import shutil
from typing import Any

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
"""Chromium from the system packages (scripts/test installs it); Playwright downloads no browser of its own."""
CHROMIUM_ARGS = [
    # No sandbox as root; no background connections on a machine with no outside network.
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def launch(playwright: Any) -> Any:
    """A headless Chromium browser from a ``sync_playwright()`` context."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
