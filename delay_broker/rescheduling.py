"""Moving a parked message whose payload carries its own due time: its framework's adapter does it.

A Celery message carries its ``eta`` in its headers: moved in the store alone, a task moved earlier would wait in a
worker for its old eta. The core knows no framework, so an adapter registers a *rescheduler* for its framework's
messages, which rewrites the payload and moves the message in one step. It registers in two ways: with
:func:`register` when it is imported, and as an entry point of the ``delay_broker.reschedulers`` group (the name is
the framework's, the value the rescheduler), which is how a process that never imported the adapter (the
``delay-broker`` command, the dashboard) finds it. Messages of a framework without one are moved by the store.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING

from .errors import ConfigurationError

if TYPE_CHECKING:
    from .store import DelayStore

Rescheduler = Callable[["DelayStore", str, datetime], "int | None"]
"""``(store, id, due)`` -> the message's new due time in ms, or None when it is not parked."""

ENTRY_POINT_GROUP = "delay_broker.reschedulers"

_registered: dict[str, Rescheduler] = {}
_declared: dict[str, EntryPoint] | None = None
_lock = threading.Lock()


def register(framework: str, rescheduler: Rescheduler) -> None:
    """Have ``rescheduler`` move every parked message of ``framework`` (an envelope's ``framework``)."""
    with _lock:
        _registered[framework] = rescheduler


def rescheduler_for(framework: str) -> Rescheduler | None:
    """The rescheduler of ``framework``'s messages, or None when the store moves them as they are.

    Raises ConfigurationError when the framework's adapter declares one that cannot be loaded (the framework is
    not installed here): moved without it, the message would keep its old due time inside.
    """
    found = _registered.get(framework)
    if found is not None or not framework:
        return found
    entry = _entry_points().get(framework)
    if entry is None:
        return None
    try:
        loaded: Rescheduler = entry.load()
    except ImportError as error:
        raise ConfigurationError(
            f"moving a {framework} message rewrites its payload, which needs {framework} installed ({error})"
        ) from None
    with _lock:
        return _registered.setdefault(framework, loaded)


def _entry_points() -> dict[str, EntryPoint]:
    """The declared reschedulers, by framework: read once per process (a scan of every installed package)."""
    global _declared
    with _lock:
        if _declared is None:
            _declared = {entry.name: entry for entry in entry_points(group=ENTRY_POINT_GROUP)}
        return _declared


__all__ = ["ENTRY_POINT_GROUP", "Rescheduler", "register", "rescheduler_for"]
