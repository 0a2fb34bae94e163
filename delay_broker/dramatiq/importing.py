"""``delay-broker import --dramatiq``: the delayed messages waiting in a broker's ``<queue>.DQ`` queues.

Dramatiq keeps a delayed message in the delay queue of its queue with an ``eta`` option until a worker takes it
(and holds it in memory until due). The import reads those queues and parks each message due later than the
threshold as the middleware parks a message sent with a long delay: same id, due at its ``eta``, canonical queue,
no ``eta``. How it moves them is :mod:`delay_broker.importing`'s:

- **RedisBroker**: ``<ns>:<queue>.DQ`` is a list of ``redis_message_id`` s (RPUSHed by producers, LPOPed by
  workers) and ``<ns>:<queue>.DQ.msgs`` a hash of the messages by that id. Taken entries go to a staging list; a
  parked one leaves it with its hash entry in one script.
- **RabbitmqBroker**: the ``<queue>.DQ`` queue, read with manual acknowledgements.

Messages a worker holds (fetched into its memory) are not in the queue: a worker with the middleware parks those
when it receives them, and a plain worker stopped gracefully puts them back into the queue.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.common import dq_name
from dramatiq.errors import DecodeError, QueueNotFound

from ..errors import ConfigurationError
from ..importing import AmqpSource, Delivery, Found, RedisListSource, Source
from .delivery import canonical_queues
from .middleware import DelayMiddleware
from .received import eta_of


def middleware_of(broker: dramatiq.Broker) -> DelayMiddleware:
    """The broker's DelayMiddleware, installed; ConfigurationError when it has none."""
    for middleware in broker.middleware:
        if isinstance(middleware, DelayMiddleware):
            middleware.install(broker)
            return middleware
    raise ConfigurationError("the broker has no DelayMiddleware: add one with broker.add_middleware()")


class Reader:
    """Reads a delayed message of the broker as the middleware parks it (see :meth:`DelayMiddleware.park`)."""

    def __init__(self, middleware: DelayMiddleware) -> None:
        self.middleware = middleware

    def __call__(self, payload: bytes) -> Found | str:
        try:
            message = dramatiq.Message.decode(payload)
        except DecodeError:
            return "unreadable with the current encoder"
        eta = eta_of(message)
        if eta is None:
            return "not delayed (no eta)"
        try:
            _, envelope = self.middleware._envelope(message)
        except QueueNotFound:
            return "queue not declared by this app"
        return Found(message.message_id, eta, envelope)


@contextlib.contextmanager
def open_sources(broker: dramatiq.Broker, queues: Iterable[str] = (), *, batch: int = 500) -> Iterator[list[Source]]:
    """A source for the delay queue of each queue the broker declares (only ``queues``, when given), on
    connections of the import's own, closed on leaving."""
    reader = Reader(middleware_of(broker))
    declared = sorted(canonical_queues(broker))
    wanted = set(queues)
    unknown = wanted - set(declared)
    if unknown:
        raise ConfigurationError(f"the app declares no queue {', '.join(sorted(unknown))} (it has: {declared})")
    names = [name for name in declared if not wanted or name in wanted]
    if isinstance(broker, RedisBroker):
        yield [_redis_source(broker, name, reader, batch) for name in names]
        return
    if type(broker).__name__ == "RabbitmqBroker":
        from .rabbitmq_queues import PikaQueues

        channels = PikaQueues(broker)
        try:
            yield [AmqpSource(channels.queue(dq_name(name)), _delivered(reader), batch=batch) for name in names]
        finally:
            channels.close()
        return
    raise ConfigurationError(
        f"delay-broker import reads the delay queues of RedisBroker and RabbitmqBroker, not {type(broker).__name__}"
        " (dramatiq-sqs keeps no delayed messages beyond SQS's 15 minutes)"
    )


def _redis_source(broker: RedisBroker, queue: str, reader: Reader, batch: int) -> RedisListSource:
    key = f"{broker.namespace}:{dq_name(queue)}"

    def classify(_: bytes, payload: bytes | None) -> Found | str:
        assert payload is not None  # the source reads the hash for every entry
        return reader(payload)

    return RedisListSource(
        broker.client,
        key,
        dq_name(queue),
        classify,
        producers_push="tail",
        payloads=f"{key}.msgs",
        batch=batch,
        notes=lambda source: _held_in_workers(broker, key, source),
    )


def _held_in_workers(broker: RedisBroker, key: str, source: RedisListSource) -> list[str]:
    """A note on the messages of the delay queue that are in no list: fetched by workers, held in memory."""
    queued, staged = source.count()
    held = int(broker.client.hlen(f"{key}.msgs")) - queued - staged
    if held <= 0:
        return []
    return [
        f"{held:,} held by workers (fetched into their memory, or by workers that died, which Dramatiq requeues): "
        "restart the workers with DelayMiddleware and they park what they receive"
    ]


def _delivered(reader: Reader) -> Any:
    def classify(delivery: Delivery) -> Found | str:
        return reader(delivery.body)

    return classify
