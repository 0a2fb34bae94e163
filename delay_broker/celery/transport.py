"""kombu transports that park long-delayed Celery tasks: subclasses of the stock redis, sentinel, pyamqp and SQS
ones.

Select one with Celery's ``broker_transport`` setting (kombu resolves it as a dotted path) and keep
``broker_url`` as it is; kombu still reads host, port, credentials and virtual host from the URL::

    broker_transport = "delay_broker.celery.transport:RedisTransport"
    # or SentinelTransport (sentinel://), AmqpTransport, SQSTransport

Each is a subclass of the real transport, not a wrapper, because Celery changes behaviour on
``transport.driver_type`` and ``implements``. Publishing is intercepted where every task passes after
routing: ``Channel._put`` for the virtual transports (redis, sentinel, SQS) and ``basic_publish`` for pyamqp. The
pidbox ``revoke`` broadcast is seen in ``basic_publish`` on all of them and cancels parked tasks.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from celery.signals import worker_init
from kombu.transport import pyamqp as kombu_pyamqp
from kombu.transport import redis as kombu_redis

from .channels import PIDBOX_SUFFIX as PIDBOX_SUFFIX
from .channels import DelayBrokerTransport, WatchesRevokes, park_virtual, watch_control
from .config import TRANSPORTS as TRANSPORTS
from .fetch import ReliableFetch
from .messages import amqp_route, encode_amqp, task_info
from .parking import Parker, capturing

logger = logging.getLogger("delay_broker.celery")

# -- virtual transports ---------------------------------------------------------------------------------------


class ParksRedisPuts(WatchesRevokes):
    """The parking ``_put`` of kombu's Redis channels (plain and Sentinel): the route is the list kombu would
    push to, priority suffix included, so exactly-once promotion can LPUSH into it."""

    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> Any:
        priority = self._get_message_priority(message, reverse=False)  # type: ignore[attr-defined]
        route: str = self._q_for_pri(queue, priority)  # type: ignore[attr-defined]
        if park_virtual(self, queue, message, route):
            # Parked directly, not inside a kombu publish batch (Celery itself never batches).
            kwargs.pop("_publish_batch", None)
            return None
        return super()._put(queue, message, **kwargs)  # type: ignore[misc]


class RedisChannel(ReliableFetch, ParksRedisPuts, kombu_redis.Channel):
    pass


class RedisTransport(DelayBrokerTransport, kombu_redis.Transport):
    """kombu's Redis transport, parking tasks whose eta is further away than the threshold."""

    Channel = RedisChannel
    delay_broker_kind = "redis"


class SentinelChannel(ReliableFetch, ParksRedisPuts, kombu_redis.SentinelChannel):
    pass


class SentinelTransport(DelayBrokerTransport, kombu_redis.SentinelTransport):
    """kombu's Redis Sentinel transport (``sentinel://``), parking tasks whose eta is further away than the
    threshold. Without a ``redis_url`` the store lives in the master the Sentinels name ``master_name``."""

    Channel = SentinelChannel
    delay_broker_kind = "sentinel"

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        # On a connection error kombu switches to the next URL of ``sentinel://h1;sentinel://h2`` and re-parses
        # it, which replaces this transport by kombu's stock one (its scheme names it): tasks would silently
        # stop being parked. Switching buys nothing here: the Sentinel pool asks every listed Sentinel for the
        # current master on each connection.
        client.cycle = None


# -- pyamqp ----------------------------------------------------------------------------------------------------

NATIVE_DELAY_EXCHANGE = re.compile(r"(?:^|_)celery_delayed_\d+$")
"""The exchanges of Celery's native delayed delivery (kombu.transport.native_delayed_delivery.level_name)."""
DELAY_LEVELS = 28
"""kombu's MAX_NUMBER_OF_BITS_TO_USE: a native delayed publish's routing key starts with one bit per level."""
DELAY_BITS = re.compile(rf"^(?:[01]\.){{{DELAY_LEVELS}}}")


def _without_delay(routing_key: str) -> str:
    return DELAY_BITS.sub("0." * DELAY_LEVELS, routing_key, count=1)


def _publish_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, str, str]:
    msg = args[0] if args else kwargs.get("msg")
    exchange = args[1] if len(args) > 1 else kwargs.get("exchange", "")
    routing_key = args[2] if len(args) > 2 else kwargs.get("routing_key", "")
    return msg, exchange or "", routing_key or ""


class AmqpChannel(kombu_pyamqp.Channel):
    """Intercepts ``_basic_publish`` (``basic_publish`` is a class alias of it) and ``basic_publish_confirm``
    (which ``amqp.Channel.__init__`` installs as ``basic_publish`` in confirm mode; a parked publish must not
    wait for a broker confirmation that will never come)."""

    _delay_broker_seen = False

    def _delay_broker_intercept(self, msg: Any, exchange: str, routing_key: str) -> bool:
        parker: Parker | None = self.connection.client.transport.delay_broker
        if parker is None:
            return False
        properties = msg.properties
        watch_control(parker, exchange, msg.body, properties.get("content_type"), properties.get("content_encoding"))
        if NATIVE_DELAY_EXCHANGE.search(exchange):
            # Celery's native delayed delivery (quorum queues): RabbitMQ holds the message in its delay
            # exchanges, not a worker, and the routing key encodes the delay; parked, it would be delayed twice.
            if not capturing():
                return False
            # A schedule's occurrence, which must be parked, never sent now: when due it goes through the same
            # exchanges with no delay left.
            routing_key = _without_delay(routing_key)
        info = task_info(properties.get("application_headers"))
        due = parker.due_if_parked(info)
        if info is None or due is None:
            return False
        extra = {"exchange": exchange, "routing_key": routing_key}
        return parker.park(
            info, due, amqp_route(exchange, routing_key), encode_amqp(msg.body, properties, **extra), extra
        )

    def _basic_publish(self, *args: Any, **kwargs: Any) -> Any:
        if not self._delay_broker_seen and self._delay_broker_intercept(*_publish_args(args, kwargs)):
            return None
        return super()._basic_publish(*args, **kwargs)

    basic_publish = _basic_publish

    def basic_publish_confirm(self, *args: Any, **kwargs: Any) -> Any:
        if self._delay_broker_intercept(*_publish_args(args, kwargs)):
            return None
        self._delay_broker_seen = True  # the inner _basic_publish must not look at it again
        try:
            return super().basic_publish_confirm(*args, **kwargs)
        finally:
            self._delay_broker_seen = False


class AmqpConnection(kombu_pyamqp.Connection):
    Channel = AmqpChannel


class AmqpTransport(DelayBrokerTransport, kombu_pyamqp.Transport):
    """kombu's pyamqp (RabbitMQ) transport, parking tasks whose eta is further away than the threshold."""

    Connection = AmqpConnection
    delay_broker_kind = "amqp"


class AmqpSSLTransport(DelayBrokerTransport, kombu_pyamqp.SSLTransport):
    """The same over TLS, as kombu's ``amqps://`` transport (what an ``amqps://`` broker URL selects)."""

    Connection = AmqpConnection
    delay_broker_kind = "amqp"


# -- SQS (needs boto3: imported only when asked for) -------------------------------------------------------------


def __getattr__(name: str) -> Any:
    if name in ("SQSTransport", "SQSChannel"):
        from . import sqs

        return getattr(sqs, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- worker bootstep, enabled by configuration alone ---------------------------------------------------------------


def _add_worker_steps(sender: Any = None, **kwargs: Any) -> None:
    """Add the promoter and control bootsteps, and the consumer step that parks the long-delayed tasks the worker
    receives, to a worker whose broker connection uses one of our transports.

    ``worker_init`` is sent after the worker created its first connection (which imported this module)
    and before it builds its blueprints from ``app.steps``.
    """
    conninfo = getattr(sender, "_conninfo", None)
    if conninfo is None:
        return
    transport = conninfo.transport
    if isinstance(transport, DelayBrokerTransport):
        from .bootstep import ControlStep, PromoterStep
        from .once import OnceStep
        from .received import ParkOnReceipt

        sender.app.steps["worker"].add(PromoterStep)
        sender.app.steps["worker"].add(ControlStep)
        sender.app.steps["worker"].add(OnceStep)
        sender.app.steps["consumer"].add(ParkOnReceipt)


worker_init.connect(_add_worker_steps, weak=False, dispatch_uid="delay_broker.celery.promoter_step")
