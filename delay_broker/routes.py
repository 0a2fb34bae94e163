"""Where a promoter may deliver: the routes its application declares, plus those any producer recorded.

A stored envelope names its route (a queue). A promoter delivers only to routes its own application declares
or that a producer of the namespace recorded in the store when it parked for them, so a crafted entry cannot
send a message anywhere else, while fleets whose processes declare different queues (one service's workers,
another's producers; a rolling deploy that adds a queue) still deliver each message to its queue.
"""

from __future__ import annotations

import time

from .store import DelayStore


class RouteBook:
    """The routes producers of the namespace parked for, kept by the store (each recorded once per process)."""

    def __init__(self, store: DelayStore) -> None:
        self.store = store
        self._recorded: set[str] = set()

    def record(self, route: str) -> None:
        if route not in self._recorded:
            self.store.record_routes([route])
            self._recorded.add(route)

    def routes(self) -> set[str]:
        return self.store.recorded_routes()


class AllowedRoutes:
    """The declared routes plus those recorded by producers, re-read at most every ``refresh`` seconds."""

    def __init__(self, static: set[str], book: RouteBook, refresh: float = 1.0) -> None:
        self.static = frozenset(static)
        self.book = book
        self.refresh = refresh
        self._cached: frozenset[str] = self.static
        self._read_at = float("-inf")

    def current(self, *, force: bool = False) -> frozenset[str]:
        now = time.monotonic()
        if force or now - self._read_at >= self.refresh:
            self._cached = self.static | self.book.routes()
            self._read_at = now
        return self._cached

    def __contains__(self, route: object) -> bool:
        if route in self.current():
            return True
        # A route recorded a moment ago may not be in the cached copy yet.
        return route in self.current(force=True)
