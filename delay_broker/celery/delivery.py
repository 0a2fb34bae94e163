"""The promoter side: deliver a due parked task back into the broker queue Celery published it to.

- Redis (or Sentinel) transport, store in the same Redis (master): :class:`RedisDirect`, exactly once. The
  promoter's atomic script LPUSHes the stored bytes, which are exactly what kombu's ``_put`` would have
  pushed, into the queue's list key (priority suffix and ``global_keyprefix`` included).
- Redis (or Sentinel) transport with the store on another Redis, and SQS: :class:`VirtualRepublisher` calls
  the stock channel's ``_put`` with the stored message; at least once under the promoter's lease.
- pyamqp (RabbitMQ): :class:`AmqpRepublisher` republishes body and properties to the same exchange and
  routing key with publisher confirms; at least once under the lease.

Every deliverer sends only to routes the app declared (configuration) or that its producers recorded
when parking (:class:`~.stores.RouteBook`); anything else is dead-lettered.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from kombu.exceptions import OperationalError as KombuOperationalError
from kombu.transport import redis as kombu_redis

from .. import sqs_errors
from ..envelope import Envelope
from ..errors import DeliveryRefused, TargetUnavailable
from ..once import PROMOTION_MARK, promotion_token
from ..store import ClaimedMessage
from ..targets import ListTarget
from .messages import amqp_route, decode_amqp, decode_virtual, parse_celery_time
from .stores import RouteBook

logger = logging.getLogger("delay_broker.celery")


def redis_priority_routes(queues: set[str], transport_options: Mapping[str, Any]) -> tuple[set[str], str]:
    """The list names kombu's Redis transport uses for ``queues`` at every priority level
    (``<queue>[<sep><step>]``, as its ``_q_for_pri``), and the separator it uses."""
    steps = transport_options.get("priority_steps") or kombu_redis.PRIORITY_STEPS
    sep = str(transport_options.get("sep") or kombu_redis.Channel.sep)
    return {queue if not step else f"{queue}{sep}{step}" for queue in queues for step in steps}, sep


def declared_queues(app: Any, extra: tuple[str, ...] = ()) -> set[str]:
    """Queue names the app's configuration declares: ``task_queues`` (or the default queue), queues this
    process consumes or created, static ``task_routes`` targets, and the ``queues`` option."""
    names = set(extra)
    names.add(app.conf.task_default_queue)
    names.update(app.amqp.queues.keys())
    routes = app.conf.task_routes
    for table in routes if isinstance(routes, list | tuple) else [routes]:
        if isinstance(table, Mapping):
            for target in table.values():
                if isinstance(target, str):
                    names.add(target)
                elif isinstance(target, Mapping) and isinstance(target.get("queue"), str):
                    names.add(target["queue"])
    return {name for name in names if name}


def declared_amqp_routes(app: Any, queues: set[str]) -> set[str]:
    """AMQP routes of the declared queues: by name on the default exchange, and ``exchange:routing_key``."""
    routes = set(queues)
    for queue in app.amqp.queues.values():
        exchange = getattr(queue.exchange, "name", "") or ""
        if exchange:
            routes.add(amqp_route(exchange, queue.routing_key or queue.name))
    return routes


class AllowedRoutes:
    """The declared routes plus those recorded by producers, re-read at most every ``refresh`` seconds."""

    def __init__(self, static: set[str], book: RouteBook, refresh: float = 1.0) -> None:
        self.static = frozenset(static)
        self.book = book
        self.refresh = refresh
        self._cached: frozenset[str] = self.static
        self._read_at = float("-inf")

    def current(self, *, force: bool = False) -> frozenset[str]:
        now = time.monotonic()
        if force or now - self._read_at >= self.refresh:
            self._cached = self.static | self.book.routes()
            self._read_at = now
        return self._cached

    def __contains__(self, route: object) -> bool:
        if route in self.current():
            return True
        # A route recorded a moment ago may not be in the cached copy yet.
        return route in self.current(force=True)


class RedisDirect:
    """Exactly-once promotion into the Redis transport's list keys (a ``DirectDeliverer``)."""

    def __init__(self, allowed: AllowedRoutes, transport_options: Mapping[str, Any]):
        self.allowed = allowed
        self.prefix = str(transport_options.get("global_keyprefix") or "")

    def direct_routes(self) -> Mapping[str, ListTarget]:
        # Read on every cycle (one SMEMBERS): a route recorded a moment ago must not be dead-lettered.
        return {route: ListTarget(self.prefix + route, mode="lpush") for route in self.allowed.current(force=True)}


class _KombuPublisher:
    """A stock-transport kombu connection of the app (our transport would park the message again)."""

    def __init__(self, connect: Callable[[], Any]) -> None:
        self._connect = connect
        self._connection: Any = None
        self._channel: Any = None

    def channel(self) -> Any:
        if self._channel is None:
            if self._connection is None:
                self._connection = self._connect()
            self._channel = self._connection.default_channel
        return self._channel

    def reset(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None:
            try:
                connection.collect()
            except Exception:  # closing a broken connection may fail too; it is dropped either way
                logger.debug("delay_broker: error while dropping a broker connection", exc_info=True)

    def connection_errors(self) -> tuple[type[BaseException], ...]:
        # kombu reports a broker it could not connect to (default_channel, after its own retries) as its own
        # OperationalError, which is in no transport's list.
        always = (ConnectionError, OSError, KombuOperationalError)
        if self._connection is None:
            return always
        errors: tuple[type[BaseException], ...] = tuple(self._connection.connection_errors)
        return (*errors, *always)

    def close(self) -> None:
        self.reset()


def _checked(message: ClaimedMessage, allowed: AllowedRoutes) -> Any:
    envelope = message.envelope
    assert envelope is not None  # the promoter dead-letters corrupt envelopes before calling us
    if envelope.framework != "celery":
        raise DeliveryRefused(f"not a Celery message (framework {envelope.framework!r})")
    if envelope.route not in allowed:
        raise DeliveryRefused(f"route {envelope.route!r} was never declared or parked for by this app")
    return envelope


class VirtualRepublisher:
    """At-least-once delivery through a stock virtual channel's ``_put`` (Redis elsewhere, SQS)."""

    def __init__(
        self,
        connect: Callable[[], Any],
        allowed: AllowedRoutes,
        priority_sep: str | None = None,
        *,
        mark: bool = False,
    ) -> None:
        self.publisher = _KombuPublisher(connect)
        self.allowed = allowed
        self.priority_sep = priority_sep  # Redis: routes of prioritised tasks are <queue><sep><step>
        self.mark = mark

    def _matches(self, queue: str, route: str) -> bool:
        return route == queue or (self.priority_sep is not None and route.startswith(queue + self.priority_sep))

    def deliver(self, message: ClaimedMessage) -> None:
        envelope = _checked(message, self.allowed)
        queue = envelope.extra.get("queue")
        if not isinstance(queue, str) or not self._matches(queue, envelope.route):
            raise DeliveryRefused(f"queue {queue!r} does not match route {envelope.route!r}")
        try:
            stored = decode_virtual(envelope.payload)
        except ValueError as error:
            raise DeliveryRefused(f"unreadable stored message: {error}") from None
        if self.mark:
            stored["headers"] = marked(stored.get("headers"), envelope)
        try:
            self.publisher.channel()._put(queue, stored)
        except self.publisher.connection_errors() as error:
            self.publisher.reset()
            raise TargetUnavailable(f"broker unavailable: {error!r}") from error
        except Exception as error:
            if sqs_errors.is_refusal(error):
                raise DeliveryRefused(f"refused by the broker: {error}") from error
            if sqs_errors.is_outage(error):  # SQS down or throttling answers over HTTP, not as a lost connection
                self.publisher.reset()
                raise TargetUnavailable(f"broker unavailable: {error}") from error
            raise

    def close(self) -> None:
        self.publisher.close()


class AmqpRepublisher:
    """At-least-once republish to RabbitMQ with publisher confirms (``mandatory``: an unroutable message is
    an error, retried with backoff, not silently dropped)."""

    def __init__(self, connect: Callable[[], Any], allowed: AllowedRoutes, *, mark: bool = False) -> None:
        self.publisher = _KombuPublisher(connect)
        self.allowed = allowed
        self.mark = mark

    def deliver(self, message: ClaimedMessage) -> None:
        import amqp

        envelope = _checked(message, self.allowed)
        try:
            record = decode_amqp(envelope.payload)
        except ValueError as error:
            raise DeliveryRefused(f"unreadable stored message: {error}") from None
        if amqp_route(record.exchange, record.routing_key) != envelope.route:
            raise DeliveryRefused(f"exchange/routing key do not match route {envelope.route!r}")
        properties = refresh_expiration(record.properties)
        if self.mark:
            properties["application_headers"] = marked(properties.get("application_headers"), envelope)
        try:
            channel = self.publisher.channel()
            channel.basic_publish(
                amqp.Message(record.body, **properties),
                exchange=record.exchange,
                routing_key=record.routing_key,
                mandatory=True,
            )
        except self.publisher.connection_errors() as error:
            self.publisher.reset()
            raise TargetUnavailable(f"broker unavailable: {error!r}") from error
        except amqp.exceptions.AMQPError:
            # A channel error (unroutable, missing exchange, nack) closes the channel: start afresh.
            self.publisher.reset()
            raise

    def close(self) -> None:
        self.publisher.close()


def marked(headers: object, envelope: Envelope) -> dict[str, Any]:
    """A task's headers with the promotion token of ``envelope`` (the ``once`` option; see
    :mod:`delay_broker.once`): every delivery of one park carries the same one, and a worker reads it from the
    task's request."""
    result = dict(headers) if isinstance(headers, Mapping) else {}
    token = promotion_token(envelope)
    if token is not None:
        result[PROMOTION_MARK] = token
    return result


def refresh_expiration(properties: Mapping[str, Any]) -> dict[str, Any]:
    """RabbitMQ counts a message's ``expiration`` from when it is enqueued; Celery computed it from the
    original publish. Recompute it from the ``expires`` header; once past, drop it so the worker receives
    the task and discards it as expired (recording REVOKED), as plain Celery would."""
    result = dict(properties)
    if "expiration" not in result:
        return result
    headers = result.get("application_headers") or {}
    expires = parse_celery_time(headers.get("expires")) if isinstance(headers, Mapping) else None
    if expires is None:
        return result
    remaining = int((expires.timestamp() - time.time()) * 1000)
    if remaining > 0:
        result["expiration"] = str(remaining)
    else:
        result.pop("expiration")
    return result
