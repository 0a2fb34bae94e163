"""The worker's side of Celery's remote control for parked tasks: ``inspect scheduled`` (and so Flower) lists them,
and a ``revoke`` from any sender cancels them.

Celery keeps its remote control commands in one registry, ``celery.worker.control.Panel``, which every worker's
mailbox reads. :func:`install_control` registers ``scheduled``, ``revoke`` and ``terminate`` there again (with
``Panel.register`` and Celery's own metadata), as handlers that call Celery's command and then do delay_broker's
part for the apps that run it; any other app gets Celery's answer unchanged.

Which broadcast is being handled (its reply ticket, whether it was addressed to some workers only) only kombu's
mailbox node knows, so the app's mailbox makes its node with :class:`RecordsBroadcasts` mixed in, which keeps it
for the handler. Every worker receives an ``inspect scheduled``; the one that claims its ticket in the store
(:func:`delay_broker.claims.claim`) adds the parked tasks, so each appears once in the replies.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from celery.worker.control import Panel
from kombu import pidbox

from ..claims import claim
from ..errors import DelayBrokerError
from ..store import DelayStore
from .config import CeleryOptions
from .inspection import note_entry, parked_entries
from .parking import Parker

logger = logging.getLogger("delay_broker.celery")

CLAIM_TTL = 300.0
"""Seconds an ``inspect`` broadcast's ticket stays claimed: far longer than any worker takes to receive it."""

Handler = Callable[..., Any]


@dataclass(frozen=True)
class Broadcast:
    """The control broadcast a worker is handling."""

    method: str
    ticket: str | None
    """Its reply ticket; None when no reply is wanted."""
    addressed: bool
    """Sent to some workers only (``destination`` or ``pattern``)."""


_current: ContextVar[Broadcast | None] = ContextVar("delay_broker_broadcast", default=None)


def current_broadcast() -> Broadcast | None:
    """The broadcast being handled now (None outside a handler, or when the mailbox does not record it)."""
    return _current.get()


class RecordsBroadcasts(pidbox.Node):
    """A mailbox node that records the broadcast it dispatches, for the handlers it calls."""

    def dispatch(
        self, method: str, arguments: Any = None, reply_to: Any = None, ticket: Any = None, **kwargs: Any
    ) -> Any:
        addressed = bool(kwargs.get("destination") or kwargs.get("pattern"))
        token = _current.set(Broadcast(method, str(ticket) if reply_to and ticket else None, addressed))
        try:
            return super().dispatch(method, arguments, reply_to, ticket, **kwargs)  # type: ignore[no-untyped-call]
        finally:
            _current.reset(token)


class ParkedTasks:
    """What one app's workers do for its parked tasks when a control broadcast comes.

    Parameters:
      store: the app's delay store.
      parker: cancels what a revoke names (with the app's ``revoke`` option).
      limit: parked tasks one ``inspect scheduled`` reply lists at most (the ``inspect_limit`` option).
    """

    def __init__(self, store: DelayStore, parker: Parker, limit: int) -> None:
        self.store = store
        self.parker = parker
        self.limit = limit

    def scheduled(self, ticket: str) -> list[dict[str, Any]]:
        """The parked tasks, if this worker is the first to claim the broadcast's ticket; else none."""
        try:
            if not claim(self.store, f"inspect:{ticket}", CLAIM_TTL):
                return []
        except DelayBrokerError as error:
            logger.warning("delay_broker: parked tasks not listed for inspect scheduled: %s", error)
            return []
        try:
            return parked_entries(self.store, self.limit)
        except Exception as error:  # the worker's own entries must still reach the caller
            logger.exception("delay_broker: could not list parked tasks for inspect scheduled")
            return [note_entry(f"delay_broker: could not list parked tasks: {error}")]

    def revoke(self, ids: Iterable[str]) -> None:
        """Cancel the parked tasks a revoke names. Every worker receiving it does so: the store removes each one
        once, and the worker that removed it logs it."""
        self.parker.cancel_revoked(list(dict.fromkeys(ids)))


_apps: weakref.WeakKeyDictionary[Any, ParkedTasks] = weakref.WeakKeyDictionary()
"""The apps running delay_broker in this process, each with its parked tasks."""


def install_control(app: Any, store: DelayStore, options: CeleryOptions, threshold: float) -> None:
    """Make this process's workers of ``app`` answer for its parked tasks (the worker bootstep calls it before the
    worker creates its mailbox). Registering the handlers again is harmless."""
    parker = Parker(store, threshold, revoke=options.revoke)
    _apps[app] = ParkedTasks(store, parker, options.inspect_limit)
    mailbox = app.control.mailbox
    if not issubclass(mailbox.node_cls, RecordsBroadcasts):
        base = mailbox.node_cls
        mailbox.node_cls = type(f"{base.__name__}RecordingBroadcasts", (RecordsBroadcasts, base), {})
    for name, wrap in (("scheduled", _scheduled), ("revoke", _revoke), ("terminate", _revoke)):
        _register(name, wrap)


def _register(name: str, wrap: Callable[[Handler], Handler]) -> None:
    original = Panel.data.get(name)
    if original is None or getattr(original, "delay_broker_wraps", None) is not None:
        return  # not a command of this Celery, or already ours
    handler = wrap(original)
    handler.delay_broker_wraps = original  # type: ignore[attr-defined]
    handler.__doc__ = original.__doc__
    # Celery's metadata (alias, signature, variadic argument ...) as it was: the same command, answered by us.
    Panel.register(handler, name=name, **Panel.meta[name]._asdict())


def _scheduled(original: Handler) -> Handler:
    def scheduled(state: Any, **arguments: Any) -> Any:
        entries = original(state, **arguments)
        parked = _apps.get(state.app)
        broadcast = current_broadcast()
        if parked is None or broadcast is None or broadcast.ticket is None or not isinstance(entries, list):
            return entries
        return [*entries, *parked.scheduled(broadcast.ticket)]

    return scheduled


def _revoke(original: Handler) -> Handler:
    """``revoke`` and ``terminate``: Celery's command (the worker's revoked set, terminating, the result backend),
    then the parked tasks it names cancelled, unless it was sent to some workers only (the others would still
    run them)."""

    def revoke(state: Any, **arguments: Any) -> Any:
        try:
            return original(state, **arguments)
        finally:
            parked = _apps.get(state.app)
            broadcast = current_broadcast()
            if parked is not None and not (broadcast is not None and broadcast.addressed):
                parked.revoke(_ids(arguments.get("task_id")))

    return revoke


def _ids(value: object) -> list[str]:
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, list | tuple | set | frozenset):
        return [item for item in value if isinstance(item, str) and item]
    return []
