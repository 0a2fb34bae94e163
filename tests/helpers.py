"""Shared test helpers."""

from __future__ import annotations

import time
from collections.abc import Callable

from delay_broker import Envelope


def envelope(payload: bytes = b"job", route: str = "ready", **fields: object) -> Envelope:
    return Envelope(route=route, payload=payload, **fields)  # type: ignore[arg-type]


def wait_for(condition: Callable[[], object], timeout: float = 10.0, interval: float = 0.01) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)
