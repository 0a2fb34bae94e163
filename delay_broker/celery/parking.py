"""The producer side: decide whether a published task is parked, park it, and cancel revoked ones."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from contextvars import ContextVar
from datetime import datetime
from typing import Any

from celery._state import get_current_task

from ..envelope import Envelope
from ..errors import DelayBrokerError, StoreUnavailable
from ..store import DelayStore
from .config import CeleryOptions, Kind
from .messages import FRAMEWORK, TaskInfo
from .stores import RouteBook, shared_store

logger = logging.getLogger("delay_broker.celery")

_captured: ContextVar[list[Envelope] | None] = ContextVar("delay_broker_captured", default=None)


@contextlib.contextmanager
def capture_parked() -> Iterator[list[Envelope]]:
    """Within the block, every task published with an eta is neither sent nor parked: its envelope, exactly
    what would have been parked, is collected in the list this yields. Recurring schedules build their
    messages this way, through Celery's own publishing path."""
    captured: list[Envelope] = []
    token = _captured.set(captured)
    try:
        yield captured
    finally:
        _captured.reset(token)


def capturing() -> bool:
    """Whether a :func:`capture_parked` block is collecting what is published now."""
    return _captured.get() is not None


class Parker:
    """Parks the tasks a transport publishes when their ``eta`` is more than ``threshold`` seconds away."""

    def __init__(self, store: DelayStore, threshold: float, *, revoke: bool = True) -> None:
        self.store = store
        self.threshold = threshold
        self.revoke = revoke
        self.routes = RouteBook(store)

    @classmethod
    def for_connection(cls, options: CeleryOptions, kind: Kind, conninfo: Any) -> Parker:
        store = shared_store(options, kind, conninfo)
        return cls(store, options.threshold_for(kind), revoke=options.revoke)

    def due_if_parked(self, info: TaskInfo | None, *, at_least: float = 0.0) -> datetime | None:
        """The due time when this task should be parked, else None (no eta, or one close enough: within the
        threshold, or within ``at_least`` seconds when that is longer)."""
        if info is None or info.eta is None:
            return None
        if _captured.get() is not None:
            return info.eta
        if info.eta.timestamp() - time.time() <= max(self.threshold, at_least):
            return None
        return info.eta

    def park(self, info: TaskInfo, due: datetime, route: str, payload: bytes, extra: dict[str, Any]) -> bool:
        """Park under the task id: one parked message per id, so a re-publish of the id replaces it (as a
        retry of a parked task does on purpose). Celery would run both: said in a WARNING.

        Returns False when the transport is to publish the task itself after all: the store refused it (down,
        full, too large ...) and it was sent from inside a running task (a retry, a chain's next step), where
        Celery turns the error into a rejected, lost task. Outside a task the error is raised to the caller."""
        envelope = Envelope(route=route, payload=payload, framework=FRAMEWORK, name=info.name, extra=extra)
        captured = _captured.get()
        if captured is not None:
            self.routes.record(route)
            captured.append(envelope)
            return True
        if self.revoke and revoked_here(info.id):
            # Revoked while it ran, and now retried: a worker would discard it on delivery, but its memory of the
            # revoke may be gone by the time a parked retry is due (a restart). Discarded here, as it would be.
            logger.info("delay_broker: discarding %s[%s], revoked: not parked", info.name, info.id)
            return True
        try:
            self.routes.record(route)
            parked = self.store.park(info.id, envelope, due=due)
        except DelayBrokerError as error:
            sender = get_current_task()
            if sender is None:
                raise
            if isinstance(error, StoreUnavailable) and not self.store.withdraw(info.id, payload):
                return True  # already being promoted: it runs from the store, once
            logger.error(
                "delay_broker: could not park %s[%s], sent from task %s[%s] (%s): published to the broker with "
                "its eta instead, as Celery would (a worker holds it until due)",
                info.name,
                info.id,
                sender.name,
                sender.request.id,
                error,
            )
            return False
        if parked.outcome == "replaced" and not info.retries:
            logger.warning(
                "delay_broker: task %s[%s] replaces a task of the same id that was parked (one parked task per id; "
                "give each task its own id, or route it to a single queue)",
                info.name,
                info.id,
            )
        if info.expires is not None and info.expires <= due:
            logger.info(
                "delay_broker: task %s[%s] expires at %s, before it is due at %s: Celery will discard it on delivery",
                info.name,
                info.id,
                info.expires.isoformat(),
                due.isoformat(),
            )
        if logger.isEnabledFor(logging.DEBUG):  # not an isoformat for every delayed send
            logger.debug("delay_broker: parked %s[%s] until %s on %r", info.name, info.id, due.isoformat(), route)
        return True

    def cancel_revoked(self, ids: list[str]) -> int:
        """Cancel parked tasks named by a revoke broadcast; the broadcast itself still goes out."""
        if not ids or not self.revoke:
            return 0
        try:
            cancelled = self.store.cancel_many(ids)
        except Exception:
            # A revoke must never fail because the delay store is away; the workers still get it.
            logger.exception("delay_broker: could not cancel parked tasks for a revoke of %s", ids)
            return 0
        if cancelled:
            logger.info("delay_broker: revoke cancelled %d parked task(s) of %s", cancelled, ids)
        return cancelled


def revoked_here(task_id: str) -> bool:
    """Whether this process is a worker that knows ``task_id`` is revoked (its revoke list, which only workers
    keep: a producer elsewhere knows nothing of it)."""
    from celery.worker import state  # only workers fill it; importing it costs nothing more

    return task_id in state.revoked
