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


def launch(playwright: Any, *args: str) -> Any:
    """A headless Chromium browser from a ``sync_playwright()`` context, with ``args`` added to its command line
    (e.g. ``--host-resolver-rules=MAP evil.example 127.0.0.1``: a name of another site served on this machine)."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=[*CHROMIUM_ARGS, *args], headless=True)
