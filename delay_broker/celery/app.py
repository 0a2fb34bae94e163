"""A Celery app's delay_broker: its options, which broker it uses, its store and its promoter.

Read from the app's configuration alone: nothing here imports the transports (:mod:`delay_broker.celery.transport`
imports this module's neighbours, never the other way round), so a transport class is told apart by the
``delay_broker_kind`` every one of ours carries.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from kombu.transport import redis as kombu_redis

from ..cron import CronScheduler
from ..errors import ConfigurationError
from ..promoter import Deliverer, DirectDeliverer, Promoter, PromoterListener
from ..store import DelayStore
from .config import OPTIONS_KEY, CeleryOptions, Kind, kind_of_scheme, parse_options
from .delivery import (
    AllowedRoutes,
    AmqpRepublisher,
    RedisDirect,
    VirtualRepublisher,
    declared_amqp_routes,
    declared_queues,
    redis_priority_routes,
)
from .occurrences import occurrence_builder, schedules_of
from .stores import REDIS_KINDS, RouteBook, same_redis, shared_store, store_client


def app_options(app: Any, **overrides: Any) -> CeleryOptions:
    """The app's ``broker_transport_options["delay_broker"]``, with ``overrides``, checked."""
    raw = dict((app.conf.broker_transport_options or {}).get(OPTIONS_KEY) or {})
    raw.update(overrides)
    return parse_options(raw)


def transport_kind(app: Any) -> tuple[Kind, bool]:
    """Which broker the app uses, and whether its ``broker_transport`` is one of ours."""
    with app.connection_for_write() as connection:
        try:
            cls = connection.get_transport_cls()
        except (KeyError, ImportError, ValueError, AttributeError) as error:
            name = connection.transport_cls
            raise ConfigurationError(f"cannot load the broker transport {name!r}: {error}") from None
    # Ours carry their kind (DelayBrokerTransport.delay_broker_kind); kombu's carry none.
    ours: Kind | None = getattr(cls, "delay_broker_kind", None) if isinstance(cls, type) else None
    if ours is not None:
        return ours, True
    if isinstance(cls, type) and issubclass(cls, kombu_redis.SentinelTransport):
        return "sentinel", False  # its driver_type is "redis"
    kind = kind_of_scheme(str(getattr(cls, "driver_type", "")))
    if kind is None:
        raise ConfigurationError(
            f"delay_broker supports the redis, sentinel, pyamqp and SQS transports, not {connection.transport_cls!r}"
        )
    return kind, False


def store_for(app: Any, options: CeleryOptions | None = None) -> DelayStore:
    """The delay store of this app (shared by the process)."""
    options = options or app_options(app)
    kind, _ = transport_kind(app)
    with app.connection_for_write() as connection:
        return shared_store(options, kind, connection)


def build_promoter(app: Any, *, listener: PromoterListener | None = None, **overrides: Any) -> Promoter:
    """A promoter for this app's parked tasks (not started): ``.start()`` runs it in a thread, ``.run()``
    in this one. ``overrides`` replace the app's options (``batch``, ``lease``, ``max_idle``, ...);
    ``listener`` receives what it does (e.g. :class:`delay_broker.metrics.PromoterMetrics`)."""
    options = app_options(app, **overrides)
    kind, _ = transport_kind(app)
    with app.connection_for_write() as connection:
        client = store_client(options, kind, connection)  # its own client: the promoter blocks on it
        direct = same_redis(options, kind, connection)
    store = DelayStore(client, **options.store_options())
    schedules = schedules_of(app)
    return Promoter(
        store,
        _deliverer(app, kind, direct, declared_queues(app, options.queues), RouteBook(store), mark=options.once),
        batch=options.batch,
        lease=options.lease,
        max_idle=options.max_idle,
        ahead=options.promote_ahead,
        listener=listener,
        # Always a scheduler: schedules stored at runtime reach workers that declare none in code.
        cron=CronScheduler(store, schedules.values(), builder=lambda call: occurrence_builder(app, call)),
    )


def _deliverer(
    app: Any, kind: Kind, direct: bool, queues: set[str], book: RouteBook, *, mark: bool = False
) -> Deliverer | DirectDeliverer:
    """How the promoter hands due tasks to the broker: into the broker's Redis in the promotion's own script
    when the store shares it, else published again through kombu (RabbitMQ with publisher confirms), each task
    marked with its promotion token when ``mark`` (the ``once`` option)."""
    if kind in REDIS_KINDS:
        transport_options = dict(app.conf.broker_transport_options or {})
        routes, sep = redis_priority_routes(queues, transport_options)
        allowed = AllowedRoutes(routes, book)
        if direct:
            return RedisDirect(allowed, transport_options)
        # kombu's stock transport of the same kind ("redis" or "sentinel"): ours would park it again.
        return VirtualRepublisher(lambda: app.connection_for_write(transport=kind), allowed, sep, mark=mark)
    if kind == "sqs":
        sqs = AllowedRoutes(queues, book)
        return VirtualRepublisher(lambda: app.connection_for_write(transport="sqs"), sqs, mark=mark)
    return AmqpRepublisher(
        lambda: app.connection_for_write(
            transport="amqps" if _amqp_tls(app) else "pyamqp", transport_options={"confirm_publish": True}
        ),
        AllowedRoutes(declared_amqp_routes(app, queues), book),
        mark=mark,
    )


def _amqp_tls(app: Any) -> bool:
    """Whether the app reaches RabbitMQ over TLS: an ``amqps://`` URL (its own transport turns TLS on)."""
    urls = str(app.conf.broker_write_url or app.conf.broker_url or "").split(";")
    return any(urlsplit(url.strip()).scheme.lower() == "amqps" for url in urls)
