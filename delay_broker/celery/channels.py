"""What every delay_broker transport and channel shares: the transport's options and parker, parking a message a
virtual channel's ``_put`` was given, and cancelling parked tasks that a ``revoke`` broadcast names.

The transports themselves (:mod:`delay_broker.celery.transport`, and :mod:`delay_broker.celery.sqs` which needs
boto3) build on these; nothing here imports them, so the adapter's modules import downward only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from .config import CeleryOptions, Kind, check_threshold, options_of
from .messages import encode_virtual, revoked_ids, task_info
from .parking import Parker

PIDBOX_SUFFIX = ".pidbox"
"""Celery's control exchange is ``<control_exchange>.pidbox`` (``celery.pidbox`` by default)."""


class DelayBrokerTransport:
    """What our transports add to kombu's: the parsed options and the parker (None when disabled).

    Options are checked in ``__init__``, which runs when a worker starts (before its banner) and on a
    producer's first publish: a bad option stops the process with a clear message. So is the threshold against
    the broker's visibility timeout (see :func:`~delay_broker.celery.config.check_threshold`).
    """

    delay_broker_kind: ClassVar[Kind]
    delay_broker: Parker | None
    delay_broker_options: CeleryOptions

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)  # type: ignore[call-arg]
        options = options_of(client.transport_options)
        check_threshold(options, self.delay_broker_kind, client.transport_options)
        self.delay_broker_options = options
        self.delay_broker = Parker.for_connection(options, self.delay_broker_kind, client) if options.enabled else None


def park_virtual(
    channel: Any, queue: str, message: dict[str, Any], route: str, check: Callable[[dict[str, Any]], None] | None = None
) -> bool:
    """Park a message ``Channel._put`` was given, if it is a task due later than the threshold. ``check`` sees
    the message before it is parked and raises to refuse it as the transport would when it is due."""
    parker: Parker | None = channel.connection.delay_broker
    if parker is None or message.get("redelivered"):
        # A restored/redelivered message (SQS reject, recover) was already delivered once: never park it.
        return False
    info = task_info(message.get("headers"))
    due = parker.due_if_parked(info)
    if info is None or due is None:
        return False
    if check is not None:
        check(message)
    return parker.park(info, due, route, encode_virtual(message), {"queue": queue})


def watch_control(channel_parker: Parker | None, exchange: str, body: Any, content_type: Any, encoding: Any) -> None:
    if channel_parker is not None and exchange and exchange.endswith(PIDBOX_SUFFIX):
        channel_parker.cancel_revoked(revoked_ids(body, content_type, encoding))


class WatchesRevokes:
    """Virtual channels: cancel parked tasks named by a ``revoke`` broadcast this process publishes.

    ``basic_publish`` sees the pidbox broadcast before routing; on SQS (no fanout) it is the only place.
    """

    connection: Any

    def basic_publish(self, message: dict[str, Any], exchange: str, routing_key: str, **kwargs: Any) -> Any:
        body, ctype, cenc = message.get("body"), message.get("content-type"), message.get("content-encoding")
        watch_control(self.connection.delay_broker, exchange, body, ctype, cenc)
        return super().basic_publish(message, exchange, routing_key, **kwargs)  # type: ignore[misc]
