"""ETA tasks a worker receives (published without delay_broker, or before it was turned on): parked, not held.

Celery's consumer hands each task message to its task's *strategy* (``celery.worker.strategy.default``). For a
task with an eta the strategy builds the request, puts it in the worker's timer and keeps the message
unacknowledged until then. ``task_received`` is sent from inside the strategy, with the request built and the
message about to be held: too late, and it cannot stop it. So a consumer bootstep wraps every task's strategy once
Celery has made them (after the ``Tasks`` step, on every consumer start): a task whose eta is more than the
threshold away is parked under its task id, due at its eta, as the message the transport received (the same one
a producer with delay_broker would have parked), then acknowledged; it never reaches the strategy. Anything else
goes on to Celery untouched, as does a task the store cannot take (it is held, as Celery always held it).

The park comes first and keeps what the store already holds (``on_conflict="keep"``): a worker killed between the
park and the acknowledgement leaves the task in the broker (restored after the visibility timeout on Redis,
requeued at once on RabbitMQ), and that delivery finds it parked and parks nothing twice.

Redis, Sentinel and RabbitMQ; on SQS a task is left to Celery (kombu's SQS messages carry the receipt of the
delivery, not the message as it was sent).
"""

from __future__ import annotations

import logging
from typing import Any

from celery import bootsteps

from ..envelope import Envelope
from ..errors import DelayBrokerError
from .app import app_options
from .config import RECEIPT_SLACK
from .messages import FRAMEWORK, amqp_route, encode_amqp, encode_virtual, task_info
from .parking import Parker
from .stores import REDIS_KINDS

logger = logging.getLogger("delay_broker.celery")


class Receiver:
    """Parks the long-delayed tasks one consumer receives.

    Parameters:
      parker: the transport's parker (its store, threshold and route book).
      kind: the transport (``redis``, ``sentinel`` or ``amqp``).
      consumer: Celery's worker consumer (its task queues, connection errors and revoked ids).
      at_least: a task due sooner than this (seconds) is never parked here, whatever the threshold: promoters send
        parked tasks ``promote_ahead`` before their eta, and one of those must not be parked again.
    """

    def __init__(self, parker: Parker, kind: str, consumer: Any, at_least: float = 0.0) -> None:
        self.parker = parker
        self.kind = kind
        self.consumer = consumer
        self.at_least = at_least
        self._queues: dict[tuple[str, str], str | None] = {}

    def wrap(self, strategy: Any) -> Any:
        return strategy if isinstance(strategy, ParkingStrategy) else ParkingStrategy(self, strategy)

    def park(self, message: Any) -> bool:
        """Park ``message`` if it is a task due later than the threshold; whether it was parked."""
        info = task_info(message.headers)
        due = self.parker.due_if_parked(info, at_least=self.at_least)
        if info is None or due is None or info.id in self.consumer.controller.state.revoked:
            return False  # a revoked task is Celery's to discard
        where = self._where(message)
        if where is None:
            return False
        route, payload, extra = where
        envelope = Envelope(route=route, payload=payload, framework=FRAMEWORK, name=info.name, extra=extra)
        try:
            self.parker.routes.record(route)
            result = self.parker.store.park(info.id, envelope, due=due, on_conflict="keep")
        except DelayBrokerError as error:
            logger.warning(
                "delay_broker: could not park received task %s[%s] due %s; the worker holds it until then, as "
                "Celery does (%s)",
                info.name,
                info.id,
                due.isoformat(),
                error,
            )
            return False
        logger.debug("delay_broker: parked received task %s[%s] until %s (%s)", info.name, info.id, due, result.outcome)
        return True

    def _where(self, message: Any) -> tuple[str, bytes, dict[str, Any]] | None:
        """The route, stored bytes and routing extras of a received message, as the producer side parks them."""
        delivery = message.delivery_info or {}
        exchange, routing_key = str(delivery.get("exchange") or ""), str(delivery.get("routing_key") or "")
        if self.kind == "amqp":
            extra = {"exchange": exchange, "routing_key": routing_key}
            return amqp_route(exchange, routing_key), encode_amqp(message.body, message.properties, **extra), extra
        raw = getattr(message, "_raw", None)
        if self.kind not in REDIS_KINDS or not isinstance(raw, dict):
            return None
        queue = self._queue(message.channel, exchange, routing_key)
        if queue is None:
            return None
        channel = message.channel
        route: str = channel._q_for_pri(queue, channel._get_message_priority(raw, reverse=False))
        return route, encode_virtual(raw), {"queue": queue}

    def _queue(self, channel: Any, exchange: str, routing_key: str) -> str | None:
        """The queue a Redis message came from: the one of this consumer's queues its exchange routes it to (the
        list it was taken from is not in the message). None when that is not one queue: left to Celery."""
        key = (exchange, routing_key)
        if key not in self._queues:
            consumed = {queue.name for queue in self.consumer.task_consumer.queues}
            if not exchange:
                found = [routing_key]
            else:
                table = channel.get_table(exchange)
                found = channel.typeof(exchange).lookup(table, exchange, routing_key, None)
            matches = sorted(set(found) & consumed)
            self._queues[key] = matches[0] if len(matches) == 1 else None
        return self._queues[key]


class ParkingStrategy:
    """A task's strategy that first parks what :class:`Receiver` takes, and acknowledges it."""

    def __init__(self, receiver: Receiver, strategy: Any) -> None:
        self.receiver = receiver
        self.strategy = strategy

    def __call__(self, message: Any, body: Any, ack: Any, reject: Any, callbacks: Any, **kwargs: Any) -> Any:
        if self.receiver.park(message):
            # Celery's own acknowledgement of a received task (a promise run soon by the consumer).
            ack(logger, self.receiver.consumer.connection_errors)
            return None
        return self.strategy(message, body, ack, reject, callbacks, **kwargs)


class ParkOnReceipt(bootsteps.StartStopStep):  # type: ignore[misc]
    """A consumer step: wraps the task strategies Celery made (``Tasks`` step) with :class:`ParkingStrategy`.

    Consumer steps start again on every broker reconnect, after ``Tasks`` has made the strategies anew.
    """

    label = "delay_broker park on receipt"
    name = "delay_broker.celery.received.ParkOnReceipt"
    requires = ("celery.worker.consumer.tasks:Tasks",)

    def include_if(self, parent: Any) -> bool:
        return bool(app_options(parent.app).enabled)

    def start(self, parent: Any) -> None:
        transport = parent.connection.transport
        parker: Parker | None = getattr(transport, "delay_broker", None)
        kind = getattr(transport, "delay_broker_kind", None)
        if parker is None or kind not in (*REDIS_KINDS, "amqp"):
            return
        receiver = Receiver(parker, kind, parent, app_options(parent.app).promote_ahead + RECEIPT_SLACK)
        for name, strategy in list(parent.strategies.items()):
            parent.strategies[name] = receiver.wrap(strategy)
