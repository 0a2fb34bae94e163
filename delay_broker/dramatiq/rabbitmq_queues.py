"""The delay queues of a RabbitmqBroker as ``delay-broker import`` reads them: pika, on a connection of its own."""

from __future__ import annotations

from typing import Any

import dramatiq
import pika  # type: ignore[import-untyped]
import pika.exceptions  # type: ignore[import-untyped]

from ..importing import Delivery


class PikaQueues:
    """A connection to the broker's RabbitMQ (with the broker's own parameters), one channel per queue read."""

    def __init__(self, broker: dramatiq.Broker) -> None:
        self.connection = pika.BlockingConnection(parameters=broker.parameters)  # type: ignore[attr-defined]

    def queue(self, name: str) -> PikaQueue:
        return PikaQueue(self.connection, name)

    def close(self) -> None:
        if self.connection.is_open:
            self.connection.close()


class PikaQueue:
    """One queue, on a channel of its own: a ``basic.nack`` of everything unacknowledged reaches only its messages
    (an :class:`~delay_broker.importing.AmqpQueue`)."""

    def __init__(self, connection: Any, name: str) -> None:
        self.connection = connection
        self.name = name
        self._channel: Any = None

    @property
    def channel(self) -> Any:
        if self._channel is None or not self._channel.is_open:
            self._channel = self.connection.channel()
        return self._channel

    def _declared(self) -> tuple[int, int]:
        """Messages ready and consumers, by a passive declare; none for a queue RabbitMQ does not have (Dramatiq
        declares a delay queue only once something uses it)."""
        try:
            frame = self.channel.queue_declare(self.name, passive=True)
        except pika.exceptions.ChannelClosedByBroker as error:
            if error.reply_code != 404:
                raise
            self._channel = None  # RabbitMQ closed it
            return 0, 0
        return int(frame.method.message_count), int(frame.method.consumer_count)

    def count(self) -> int:
        return self._declared()[0]

    def consumers(self) -> int:
        return self._declared()[1]

    def get(self) -> Delivery | None:
        method, _, body = self.channel.basic_get(self.name, auto_ack=False)
        if method is None:
            return None
        exchange, routing_key = method.exchange or "", method.routing_key or ""
        return Delivery(method.delivery_tag, bytes(body), {}, exchange, routing_key, bool(method.redelivered))

    def ack(self, tags: list[int]) -> None:
        for tag in tags:
            self.channel.basic_ack(tag)

    def requeue_all(self) -> None:
        if self._channel is not None and self._channel.is_open:
            # Tag 0 with multiple: every delivery of this channel not acknowledged yet.
            self._channel.basic_nack(delivery_tag=0, multiple=True, requeue=True)
