"""Importing delayed messages that wait in broker queues into the delay store (``delay-broker import``).

Messages delayed before delay_broker was turned on (or by producers without it) wait in the broker: Dramatiq's
``<queue>.DQ`` queues, Celery's queues with an ``eta`` header. An import parks each one due later than the
threshold under its own id and due time, as the message the framework is to receive when it is due, and removes
it from the broker. The adapters say how to read their messages (:mod:`delay_broker.dramatiq.importing`,
:mod:`delay_broker.celery.importing`); this package moves them, knowing neither framework.

Exactly once, when interrupted and run again: every message goes through three steps, and a run killed between
any two leaves a state the next run completes.

1. **Taken** out of the consumers' reach: a Redis list entry moves into a staging list of the import's own in one
   script; a RabbitMQ message is held unacknowledged from the moment it is read.
2. **Parked** with ``on_conflict="keep"``: a message already parked (by an earlier run, or by a worker that
   received it) is kept as it is, never parked twice.
3. **Removed** from the broker: the staging entry (and on Dramatiq's RedisBroker its payload) in one script; the
   RabbitMQ message acknowledged.

Killed after 1, the entry waits in the staging list (Redis) for the next run, or is requeued by RabbitMQ when the
connection closes; killed after 2, the next run finds it parked and only removes it. See docs/cli.md ("delay-broker
import") for the one case this cannot close: a message parked, not yet removed, and run from the store before the
next run (or a consumer without delay_broker, on RabbitMQ) sees it again.
"""

from __future__ import annotations

from .amqp import AmqpQueue, AmqpSource, Delivery
from .model import Found, Item, QueueReport, Source
from .redis_lists import RedisListSource
from .runner import Importer

__all__ = [
    "AmqpQueue",
    "AmqpSource",
    "Delivery",
    "Found",
    "Importer",
    "Item",
    "QueueReport",
    "RedisListSource",
    "Source",
]
