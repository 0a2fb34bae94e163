"""The adapter's public functions: enable it, check its configuration, build a promoter, cancel/reschedule."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from kombu.transport import pyamqp as kombu_pyamqp
from kombu.transport import redis as kombu_redis

from ..clock import delay_to_ms, ms_to_datetime
from ..cron import CronScheduler
from ..errors import ConfigurationError, InvalidDelay
from ..promoter import Deliverer, DirectDeliverer, Promoter, PromoterListener
from ..store import DelayStore, MessageInfo
from .config import OPTIONS_KEY, CeleryOptions, Kind, check_threshold, kind_of_scheme, parse_options
from .delivery import (
    AllowedRoutes,
    AmqpRepublisher,
    RedisDirect,
    VirtualRepublisher,
    declared_amqp_routes,
    declared_queues,
    redis_priority_routes,
)
from .messages import parse_celery_time, reschedule_parked
from .schedules import occurrence_builder, schedules_of
from .stores import REDIS_KINDS, RouteBook, check_store, same_redis, shared_store, store_client


def app_options(app: Any, **overrides: Any) -> CeleryOptions:
    """The app's ``broker_transport_options["delay_broker"]``, with ``overrides``, checked."""
    raw = dict((app.conf.broker_transport_options or {}).get(OPTIONS_KEY) or {})
    raw.update(overrides)
    return parse_options(raw)


def transport_kind(app: Any) -> tuple[Kind, bool]:
    """Which broker the app uses, and whether its ``broker_transport`` is one of ours."""
    from .transport import DelayBrokerTransport

    with app.connection_for_write() as connection:
        try:
            cls = connection.get_transport_cls()
        except (KeyError, ImportError, ValueError, AttributeError) as error:
            name = connection.transport_cls
            raise ConfigurationError(f"cannot load the broker transport {name!r}: {error}") from None
    if isinstance(cls, type) and issubclass(cls, DelayBrokerTransport):
        return cls.delay_broker_kind, True
    if isinstance(cls, type) and issubclass(cls, kombu_redis.SentinelTransport):
        return "sentinel", False  # its driver_type is "redis"
    kind = kind_of_scheme(str(getattr(cls, "driver_type", "")))
    if kind is None:
        raise ConfigurationError(
            f"delay_broker supports the redis, sentinel, pyamqp and SQS transports, not {connection.transport_cls!r}"
        )
    return kind, False


def validate(app: Any) -> CeleryOptions:
    """Check the app's delay_broker configuration now; raises ConfigurationError with a clear message.

    Workers check it when they start; call this (or :func:`install`) in producer-only processes such as web
    apps, which otherwise would first notice a bad option on their first publish.
    """
    options = app_options(app)
    urls = [url for url in str(app.conf.broker_write_url or app.conf.broker_url or "").split(";") if url]
    kind, wrapped = transport_kind(app)
    if not wrapped and options.enabled:
        raise ConfigurationError(
            "delay_broker options are set but broker_transport is not a delay_broker transport; set "
            f"broker_transport = {_transport_path(kind)!r} (or call delay_broker.celery.install(app))"
        )
    for url in urls:
        scheme = urlsplit(url.strip()).scheme
        scheme_kind = kind_of_scheme(scheme)
        if scheme_kind is not None and scheme_kind != kind:
            raise ConfigurationError(f"broker_url {scheme}:// does not match {_transport_path(kind)!r}")
        if scheme.lower() == "amqps" and not _tls_transport(app) and not app.conf.broker_use_ssl:
            # Our plain transport would log in without TLS, where Celery alone insists on it.
            raise ConfigurationError(
                f"broker_url amqps:// needs TLS: set broker_transport = {_transport_path(kind, scheme)!r} "
                "(install() does), or broker_use_ssl"
            )
    if len(urls) > 1 and kind != "sentinel":
        # Sentinel: one sentinel:// URL per Sentinel is the normal form, and our transport keeps kombu from
        # switching between them (see transport.SentinelTransport).
        raise ConfigurationError("delay_broker does not support failover broker URLs (kombu drops the transport)")
    with app.connection_for_write() as connection:
        check_store(options, kind, connection)  # raises if there is no Redis for the store
        check_threshold(options, kind, connection.transport_options)
    return options


def _transport_path(kind: Kind, scheme: str = "") -> str:
    from .transport import TRANSPORTS

    return TRANSPORTS["amqps" if scheme.lower() == "amqps" else kind]


def _tls_transport(app: Any) -> bool:
    """Whether the app's broker transport is kombu's TLS one for AMQP (or ours of it)."""
    with app.connection_for_write() as connection:
        return issubclass(connection.get_transport_cls(), kombu_pyamqp.SSLTransport)


def _amqp_tls(app: Any) -> bool:
    """Whether the app reaches RabbitMQ over TLS: an ``amqps://`` URL (its own transport turns TLS on)."""
    urls = str(app.conf.broker_write_url or app.conf.broker_url or "").split(";")
    return any(urlsplit(url.strip()).scheme.lower() == "amqps" for url in urls)


def install(app: Any, **options: Any) -> CeleryOptions:
    """Enable delay_broker on a Celery app in one line (after the app is configured).

    Sets ``broker_transport`` to our wrapper of the transport ``broker_url`` names, merges ``options``
    into ``broker_transport_options["delay_broker"]``, adds the promoter bootstep to the worker, and
    validates the result (raising ConfigurationError on any problem).
    """
    transport_options = dict(app.conf.broker_transport_options or {})
    raw = dict(transport_options.get(OPTIONS_KEY) or {})
    raw.update(options)
    parse_options(raw)
    url = str(app.conf.broker_write_url or app.conf.broker_url or "amqp://")
    scheme = urlsplit(url.split(";")[0].strip()).scheme
    kind = kind_of_scheme(scheme)
    current = app.conf.broker_transport
    if isinstance(current, str) and current.startswith("delay_broker."):
        kind = kind or transport_kind(app)[0]
    if kind is None:
        raise ConfigurationError(
            f"delay_broker supports redis://, sentinel://, amqp:// and sqs:// brokers, not {scheme}://"
        )
    transport_options[OPTIONS_KEY] = raw
    previous = (app.conf.broker_transport, app.conf.broker_transport_options)
    app.conf.broker_transport = _transport_path(kind, scheme)
    app.conf.broker_transport_options = transport_options
    try:
        checked = validate(app)
    except ConfigurationError:
        # A refused install leaves the app as it was: a caller that catches the error keeps a working app.
        app.conf.broker_transport, app.conf.broker_transport_options = previous
        raise
    from .bootstep import PromoterStep

    app.steps["worker"].add(PromoterStep)
    return checked


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
    queues = declared_queues(app, options.queues)
    book = RouteBook(store)
    transport_options = dict(app.conf.broker_transport_options or {})
    deliverer: Deliverer | DirectDeliverer
    if kind in REDIS_KINDS:
        routes, sep = redis_priority_routes(queues, transport_options)
        allowed = AllowedRoutes(routes, book)
        if direct:
            deliverer = RedisDirect(allowed, transport_options)
        else:
            # kombu's stock transport of the same kind ("redis" or "sentinel"): ours would park it again.
            stock = kind
            deliverer = VirtualRepublisher(lambda: app.connection_for_write(transport=stock), allowed, sep)
    elif kind == "sqs":
        deliverer = VirtualRepublisher(lambda: app.connection_for_write(transport="sqs"), AllowedRoutes(queues, book))
    else:
        deliverer = AmqpRepublisher(
            lambda: app.connection_for_write(
                transport="amqps" if _amqp_tls(app) else "pyamqp", transport_options={"confirm_publish": True}
            ),
            AllowedRoutes(declared_amqp_routes(app, queues), book),
        )
    schedules = schedules_of(app)
    return Promoter(
        store,
        deliverer,
        batch=options.batch,
        lease=options.lease,
        max_idle=options.max_idle,
        listener=listener,
        # Always a scheduler: schedules stored at runtime reach workers that declare none in code.
        cron=CronScheduler(store, schedules.values(), builder=lambda call: occurrence_builder(app, call)),
    )


# -- parked tasks by id -------------------------------------------------------------------------------------------


def get(app: Any, task_id: str) -> MessageInfo | None:
    """What the store holds for a task id (state ``due``, ``inflight`` or ``dead``), or None."""
    return store_for(app).get(task_id)


def cancel(app: Any, task_id: str) -> bool:
    """Cancel a parked task: True if it was parked and is now gone for good; False if it was not parked
    (never parked, already promoted, or being promoted right now)."""
    return store_for(app).cancel(task_id)


def reschedule(
    app: Any, task_id: str, *, countdown: float | None = None, eta: datetime | str | None = None
) -> datetime | None:
    """Move a parked task to ``countdown`` seconds from now or to ``eta`` (naive: UTC, as the worker reads
    it). The stored message's ``eta`` header is rewritten to match, so a task moved earlier runs then
    instead of waiting in a worker for its old eta. Returns the new due time, or None if not parked."""
    if (countdown is None) == (eta is None):
        raise InvalidDelay("give exactly one of countdown and eta")
    store = store_for(app)
    if countdown is not None:
        countdown_ms = delay_to_ms(countdown)
        due = ms_to_datetime(store.now_ms() + countdown_ms)  # the Redis clock, like every relative delay
    else:
        parsed = parse_celery_time(eta)
        if parsed is None:
            raise InvalidDelay(f"eta must be a datetime or an ISO 8601 string, got {eta!r}")
        due = parsed
    due_ms = reschedule_parked(store, task_id, due)
    return None if due_ms is None else ms_to_datetime(due_ms)
