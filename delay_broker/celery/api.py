"""The adapter's public functions: enable it, check its configuration, build a promoter, cancel/reschedule.

The app's options, store and promoter are :mod:`delay_broker.celery.app`'s; their functions are importable from
here too.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from kombu.transport import pyamqp as kombu_pyamqp

from ..clock import delay_to_ms, ms_to_datetime
from ..errors import ConfigurationError, InvalidDelay
from ..store import MessageInfo
from .app import app_options, build_promoter, store_for, transport_kind
from .bootstep import ControlStep, PromoterStep
from .config import OPTIONS_KEY, TRANSPORTS, CeleryOptions, Kind, check_threshold, kind_of_scheme, parse_options
from .messages import parse_celery_time, reschedule_parked
from .once import OnceStep
from .received import ParkOnReceipt
from .stores import check_store


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
    return TRANSPORTS["amqps" if scheme.lower() == "amqps" else kind]


def _tls_transport(app: Any) -> bool:
    """Whether the app's broker transport is kombu's TLS one for AMQP (or ours of it)."""
    with app.connection_for_write() as connection:
        return issubclass(connection.get_transport_cls(), kombu_pyamqp.SSLTransport)


def install(app: Any, **options: Any) -> CeleryOptions:
    """Enable delay_broker on a Celery app in one line (after the app is configured).

    Sets ``broker_transport`` to our wrapper of the transport ``broker_url`` names, merges ``options``
    into ``broker_transport_options["delay_broker"]``, adds the worker's bootsteps (the promoter; the answers to
    Celery's remote control, ``inspect scheduled`` and ``revoke``, for parked tasks) and the consumer step that
    parks the long-delayed tasks the worker receives, and validates the result (raising ConfigurationError on any
    problem).
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
    app.steps["worker"].add(PromoterStep)
    app.steps["worker"].add(ControlStep)
    app.steps["worker"].add(OnceStep)
    app.steps["consumer"].add(ParkOnReceipt)
    return checked


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


__all__ = [
    "app_options",
    "build_promoter",
    "cancel",
    "get",
    "install",
    "reschedule",
    "store_for",
    "transport_kind",
    "validate",
]
