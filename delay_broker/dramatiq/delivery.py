"""Deliverers: how a due Dramatiq message goes back into its broker's queue.

- :class:`RedisQueues` moves it into a RedisBroker's queue inside the store's own Redis, in one atomic
  script: exactly once, with no lease.
- :class:`BrokerDeliverer` decodes it and calls the broker's own ``enqueue`` (the original one, not the
  middleware's wrapper), so every other middleware sees the message: at least once, under the lease.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import dramatiq
import redis
from dramatiq.common import q_name
from dramatiq.errors import DecodeError, QueueNotFound

from .. import sqs_errors
from ..errors import DeliveryRefused, TargetUnavailable
from ..once import PROMOTION_MARK, promotion_token
from ..store import ClaimedMessage
from ..targets import ListTarget

# Dramatiq 2 renamed ConnectionError to BrokerConnectionError (the old name still works, with a warning).
_errors: Any = dramatiq.errors
BrokerConnectionError: type[Exception] = getattr(_errors, "BrokerConnectionError", None) or _errors.ConnectionError

FRAMEWORK = "dramatiq"

Enqueue = Callable[..., "dramatiq.Message[Any]"]


def canonical_queues(broker: dramatiq.Broker) -> set[str]:
    """The broker's declared queues without their ``.DQ``/``.XQ`` variants (StubBroker lists those too)."""
    return {q_name(name) for name in broker.get_declared_queues()}


def redis_queue_target(namespace: str, queue_name: str) -> ListTarget:
    """RedisBroker's keys for one queue: ``<ns>:<queue>`` (ids, RPUSHed) and ``<ns>:<queue>.msgs`` (payloads)."""
    list_key = f"{namespace}:{queue_name}"
    return ListTarget(list_key, mode="hash", hash_key=f"{list_key}.msgs")


class RedisQueues:
    """A :class:`~delay_broker.promoter.DirectDeliverer` for a RedisBroker whose Redis holds the store.

    Routes are the broker's declared queues, read again on every cycle so queues declared later are
    served; a parked message for any other queue is dead-lettered.
    """

    def __init__(self, broker: dramatiq.Broker) -> None:
        self.broker = broker
        self._queues: frozenset[str] = frozenset()
        self._routes: dict[str, ListTarget] = {}

    def direct_routes(self) -> Mapping[str, ListTarget]:
        queues = frozenset(canonical_queues(self.broker))
        if queues != self._queues:
            namespace = self.broker.namespace  # type: ignore[attr-defined]
            self._routes = {name: redis_queue_target(namespace, name) for name in sorted(queues)}
            self._queues = queues
        return self._routes


class BrokerDeliverer:
    """A :class:`~delay_broker.promoter.Deliverer` that enqueues through the broker's own ``enqueue``.

    Parameters:
      broker: the broker whose declared queues may be delivered to.
      enqueue: the broker's original ``enqueue`` (so a due message is not parked again).
    """

    def __init__(self, broker: dramatiq.Broker, enqueue: Enqueue) -> None:
        self.broker = broker
        self.enqueue = enqueue

    def deliver(self, message: ClaimedMessage) -> None:
        outgoing = self.message_of(message)
        try:
            self.enqueue(outgoing)
        except Exception as error:
            kind = classify(error)
            if kind is None:
                raise  # temporary as far as we know: the promoter retries it with backoff
            raise kind(f"{type(error).__name__}: {error}") from error

    def message_of(self, claimed: ClaimedMessage) -> dramatiq.Message[Any]:
        """The Dramatiq message to enqueue, or :class:`DeliveryRefused` if it can never be delivered."""
        envelope = claimed.envelope
        assert envelope is not None  # the promoter dead-letters corrupt envelopes before calling us
        if envelope.framework != FRAMEWORK:
            raise DeliveryRefused(f"not a Dramatiq message (framework {envelope.framework!r})")
        # Same rule as the direct script: a stored message only reaches queues the application declared.
        if envelope.route not in canonical_queues(self.broker):
            raise DeliveryRefused(f"unknown queue {envelope.route!r}: not declared on this broker")
        try:
            message = dramatiq.Message.decode(envelope.payload)
        except DecodeError as error:
            raise DeliveryRefused(f"cannot decode the message with the current encoder: {error}") from None
        if message.message_id != claimed.id or q_name(message.queue_name) != envelope.route:
            raise DeliveryRefused("message id or queue does not match the envelope")
        options = {key: value for key, value in message.options.items() if key != "eta"}
        token = promotion_token(envelope) if marks_promotions(self.broker) else None
        if token is not None:
            options[PROMOTION_MARK] = token  # every delivery of this park carries the same token
        return dataclasses.replace(message, queue_name=envelope.route, options=options)


def marks_promotions(broker: dramatiq.Broker) -> bool:
    """Whether the promoters of ``broker`` mark what they promote: it has an ``OnceMiddleware`` (which sets
    ``marks_promotions``; :mod:`.once` imports this module's neighbours, not the other way round)."""
    return any(getattr(middleware, "marks_promotions", False) for middleware in broker.middleware)


def classify(error: BaseException) -> type[DeliveryRefused] | type[TargetUnavailable] | None:
    """DeliveryRefused for errors that will never pass, TargetUnavailable for an unreachable broker.

    RabbitmqBroker reports an outage as ``ConnectionClosed`` after its own reconnect attempts, RedisBroker as
    redis-py's ``ConnectionError``, dramatiq-sqs as botocore's errors (see :mod:`delay_broker.sqs_errors`).
    """
    if isinstance(error, QueueNotFound | DeliveryRefused):
        return DeliveryRefused
    if isinstance(error, BrokerConnectionError) and error.args and _channel_error(error.args[0]):
        # RabbitmqBroker wraps what closed a channel (a nack, an unroutable message, a message over the size
        # limit) as ConnectionClosed too: that is this message's failure, not an outage that holds up all.
        wrapped = error.args[0]
        reply_code = getattr(wrapped, "reply_code", None)
        return DeliveryRefused if reply_code == 406 and "size" in str(wrapped) else None
    if isinstance(error, BrokerConnectionError | redis.ConnectionError | redis.TimeoutError | ConnectionError):
        return TargetUnavailable
    if _sqs_too_large(error) or sqs_errors.is_refusal(error):
        return DeliveryRefused
    if sqs_errors.is_outage(error):
        return TargetUnavailable
    return None


def _sqs_too_large(error: BaseException) -> bool:
    """True for dramatiq-sqs's refusal of a message over its size limit."""
    if type(error).__module__.startswith("dramatiq_sqs") and type(error).__name__ == "MessageTooLarge":
        return True
    # Before 0.4.1 dramatiq-sqs had no exception classes: a bare RuntimeError, known by its text.
    return type(error) is RuntimeError and str(error).startswith("Messages in SQS can be at most")


def _channel_error(error: object) -> bool:
    """True for pika's channel-level errors (the connection itself is fine)."""
    if not type(error).__module__.startswith("pika"):
        return False
    import pika.exceptions  # type: ignore[import-untyped]

    return isinstance(error, pika.exceptions.AMQPChannelError)
