"""Shared test helpers."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from delay_broker import Envelope


def envelope(payload: bytes = b"job", route: str = "ready", **fields: object) -> Envelope:
    return Envelope(route=route, payload=payload, **fields)  # type: ignore[arg-type]


def wait_for(
    condition: Callable[[], Any], timeout: float = 10.0, what: str = "condition", *, interval: float = 0.01
) -> Any:
    """Poll ``condition`` until it returns something true, and return that; AssertionError after ``timeout`` s.

    Test modules that poll something costly, or need longer, bind their own defaults with functools.partial.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout} s")
        time.sleep(interval)
