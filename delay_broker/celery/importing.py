"""``delay-broker import --celery``: ETA and countdown tasks waiting in a Celery app's broker queues.

A task published with an eta waits in its queue until a worker takes it (and holds it in memory until due). The
import reads the app's queues and parks each task due later than the threshold as a producer with delay_broker
parks it: under its task id, due at its eta, as the message the transport carries (the bytes kombu pushed to the
Redis list; on RabbitMQ the body, properties, exchange and routing key). Every other message (ready tasks, tasks
due soon, anything that is not a task) stays where it is. How the messages move is :mod:`delay_broker.importing`'s:

- **Redis and Sentinel**: each queue's lists (``<queue>`` and its priority lists, ``global_keyprefix`` included),
  LPUSHed by producers and popped from the tail by workers. The entries not moved are never touched.
- **RabbitMQ** (pyamqp): each queue, read with manual acknowledgements; what is not moved returns to the queue
  when the import closes its channel (RabbitMQ puts it back at its place when it can).

SQS cannot be read this way (a message read is hidden, not held, and comes back only after its visibility timeout).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import redis

from ..clock import due_to_ms
from ..envelope import Envelope
from ..errors import ConfigurationError
from ..importing import AmqpSource, Delivery, Found, RedisListSource, Source
from .app import app_options, transport_kind
from .delivery import declared_queues
from .messages import FRAMEWORK, amqp_route, decode_virtual, encode_amqp, task_info
from .stores import REDIS_KINDS


@contextlib.contextmanager
def open_sources(app: Any, queues: Iterable[str] = (), *, batch: int = 500) -> Iterator[list[Source]]:
    """A source for each queue of the app (``task_queues``, the default queue, routes' targets, the ``queues``
    option), or for ``queues`` when given, on a broker connection of the import's own, closed on leaving."""
    kind, _ = transport_kind(app)
    names = sorted(set(queues) or declared_queues(app, app_options(app).queues))
    if kind not in (*REDIS_KINDS, "amqp"):
        raise ConfigurationError(
            f"delay-broker import reads Celery's Redis, Sentinel and RabbitMQ queues, not {kind}: an SQS message "
            "cannot be read without hiding it until its visibility timeout"
        )
    with app.connection_for_read() as connection:
        if kind == "amqp":
            queues_read = [KombuAmqpQueue(connection, name) for name in names]
            try:
                yield [AmqpSource(queue, read_amqp, batch=batch) for queue in queues_read]
            finally:
                for queue in queues_read:
                    queue.close()
            return
        yield redis_sources(connection.default_channel, names, batch)


def redis_sources(channel: Any, queues: list[str], batch: int) -> list[Source]:
    """The lists of ``queues`` on kombu's Redis channel ``channel``, every priority level of each."""
    client = redis.Redis(connection_pool=channel.pool)  # kombu's own would prefix keys; ours are prefixed here
    prefix = str(getattr(channel, "global_keyprefix", "") or "")
    sources: list[Source] = []
    for queue in queues:
        for priority in channel.priority_steps:
            route: str = channel._q_for_pri(queue, priority)
            name = queue if route == queue else f"{queue} (priority {priority})"
            sources.append(
                RedisListSource(
                    client, prefix + route, name, _virtual_reader(queue, route), producers_push="head", batch=batch
                )
            )
    return sources


def _virtual_reader(queue: str, route: str) -> Any:
    def classify(entry: bytes, _: bytes | None) -> Found | str:
        try:
            message = decode_virtual(entry)
        except (ValueError, TypeError):
            return "unreadable (not a kombu message)"
        info = task_info(message.get("headers"))
        if info is None:
            return "not a task (protocol 2)"
        if info.eta is None:
            return "not delayed (no eta)"
        # The entry itself: exactly what kombu pushed, what a direct promotion pushes back.
        envelope = Envelope(route=route, payload=entry, framework=FRAMEWORK, name=info.name, extra={"queue": queue})
        return Found(info.id, due_to_ms(info.eta), envelope)

    return classify


def read_amqp(delivery: Delivery) -> Found | str:
    """A task taken from a RabbitMQ queue, as the AMQP transport parks it when it is published."""
    info = task_info(delivery.properties.get("application_headers"))
    if info is None:
        return "not a task (protocol 2)"
    if info.eta is None:
        return "not delayed (no eta)"
    extra = {"exchange": delivery.exchange, "routing_key": delivery.routing_key}
    envelope = Envelope(
        route=amqp_route(delivery.exchange, delivery.routing_key),
        payload=encode_amqp(delivery.body, delivery.properties, **extra),
        framework=FRAMEWORK,
        name=info.name,
        extra=extra,
    )
    return Found(info.id, due_to_ms(info.eta), envelope)


class KombuAmqpQueue:
    """One RabbitMQ queue on a py-amqp channel of its own (an :class:`~delay_broker.importing.AmqpQueue`). py-amqp
    has no ``basic.nack``: closing the channel returns what it took and did not acknowledge."""

    def __init__(self, connection: Any, name: str) -> None:
        self.connection = connection
        self.name = name
        self._channel: Any = None

    @property
    def channel(self) -> Any:
        if self._channel is None:
            self._channel = self.connection.channel()
        return self._channel

    def _declared(self) -> tuple[int, int]:
        from amqp.exceptions import NotFound

        try:
            declared = self.channel.queue_declare(queue=self.name, passive=True)
        except NotFound:
            self._channel = None  # RabbitMQ closed it: a queue nothing declared yet holds nothing
            return 0, 0
        return int(declared.message_count), int(declared.consumer_count)

    def count(self) -> int:
        return self._declared()[0]

    def consumers(self) -> int:
        return self._declared()[1]

    def get(self) -> Delivery | None:
        message = self.channel.basic_get(queue=self.name, no_ack=False)
        if message is None:
            return None
        info, properties = message.delivery_info, dict(message.properties)
        body = message.body
        if isinstance(body, str):  # py-amqp decodes a body that names its content_encoding: back to its bytes
            body = body.encode(str(properties.get("content_encoding") or "utf-8"))
        return Delivery(
            info["delivery_tag"],
            bytes(body),
            properties,
            str(info.get("exchange") or ""),
            str(info.get("routing_key") or ""),
            bool(info.get("redelivered")),
        )

    def ack(self, tags: list[int]) -> None:
        for tag in tags:
            self.channel.basic_ack(tag)

    def requeue_all(self) -> None:
        self.close()

    def close(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            with contextlib.suppress(Exception):
                channel.close()
