"""Importing from a RabbitMQ queue: read with manual acknowledgements, acknowledge only what is parked.

RabbitMQ has no way to look at a message without taking it. The import takes each message of the queue with
``basic.get`` (no auto-ack), up to as many as the queue held when it started, so it never reads one twice: the
ones it parks are acknowledged once parked; every other one stays unacknowledged, out of the consumers' reach,
until the end of the run, when all go back in one ``basic.nack`` with requeue (RabbitMQ puts a requeued message
back at its place in the queue when it can; ``nack`` does not count as a failed delivery towards a quorum queue's
delivery limit). A run killed at any point closes its connection, and RabbitMQ requeues every message it had not
acknowledged: parked ones included, which the next run finds parked already and acknowledges.

The client library is the adapter's (pika for Dramatiq, py-amqp for Celery), behind :class:`AmqpQueue`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from .model import Found, Item


@dataclass(frozen=True)
class Delivery:
    """A message taken from a queue, unacknowledged: as published (body, properties, exchange, routing key)."""

    tag: int
    body: bytes
    properties: dict[str, Any]
    exchange: str
    routing_key: str
    redelivered: bool = False


class AmqpQueue(Protocol):
    """A queue on one channel of the adapter's AMQP client."""

    name: str

    def count(self) -> int:
        """Messages ready in the queue now (not those delivered to consumers and unacknowledged)."""
        ...

    def get(self) -> Delivery | None:
        """The next message, unacknowledged; None when the queue is empty."""
        ...

    def consumers(self) -> int:
        """Consumers attached to the queue now."""
        ...

    def ack(self, tags: list[int]) -> None: ...

    def requeue_all(self) -> None:
        """Every message this channel took and did not acknowledge goes back to the queue."""
        ...


class AmqpSource:
    """One RabbitMQ queue (a :class:`~.model.Source`).

    Parameters:
      queue: the queue, on a channel of the import's own.
      classify: reads a message: the message to park, or why it stays.
      batch: messages parked at once.
    """

    def __init__(self, queue: AmqpQueue, classify: Callable[[Delivery], Found | str], *, batch: int = 500) -> None:
        self.queue = queue
        self.name = queue.name
        self.classify = classify
        self.batch = batch
        self._finished = False

    def recover(self) -> Iterator[list[Item]]:
        # An interrupted run's messages went back to the queue when its connection closed: the scan finds them.
        return iter(())

    def scan(self) -> Iterator[list[Item]]:
        remaining = self.queue.count()
        while remaining > 0:
            items: list[Item] = []
            while remaining > 0 and len(items) < self.batch:
                delivery = self.queue.get()
                if delivery is None:
                    remaining = 0
                    break
                remaining -= 1
                items.append(Item(delivery.tag, self.classify(delivery)))
            if items:
                yield items

    def take(self, items: list[Item]) -> list[Item]:
        return items  # held, unacknowledged, since they were read

    def release(self, items: list[Item]) -> None:
        if items:
            self.queue.ack([item.handle for item in items])

    def give_back(self, items: list[Item]) -> None:
        return None  # with everything else at the end, in its place

    def finish(self) -> None:
        if not self._finished:
            self._finished = True
            self.queue.requeue_all()

    def notes(self) -> list[str]:
        consumers = self.queue.consumers()
        if not consumers:
            return []
        return [
            f"{consumers} consumer(s) attached: the messages they hold unacknowledged are not in the queue (a worker "
            "without delay_broker holds delayed messages until due); restarted with delay_broker, workers park "
            "what they receive"
        ]
