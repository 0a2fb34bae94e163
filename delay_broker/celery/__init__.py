"""Celery adapter: long ``countdown=``/``eta=`` tasks are parked in Redis instead of held by workers.

Enable it with configuration (see the README's Celery section)::

    app.conf.broker_transport = "delay_broker.celery.transport:RedisTransport"
    # or SentinelTransport (sentinel://), AmqpTransport, SQSTransport
    app.conf.broker_transport_options = {"delay_broker": {"threshold": 60}}

or in one line, after the app is configured: ``delay_broker.celery.install(app, threshold=60)``.
"""

from __future__ import annotations

from .api import (
    app_options,
    build_promoter,
    cancel,
    get,
    install,
    reschedule,
    store_for,
    transport_kind,
    validate,
)
from .config import DEFAULT_NAMESPACE, DEFAULT_THRESHOLDS, OPTIONS_KEY, CeleryOptions, parse_options
from .schedules import runtime_schedules, schedule, schedules_of

TRANSPORT_REDIS = "delay_broker.celery.transport:RedisTransport"
TRANSPORT_SENTINEL = "delay_broker.celery.transport:SentinelTransport"
TRANSPORT_AMQP = "delay_broker.celery.transport:AmqpTransport"
TRANSPORT_AMQPS = "delay_broker.celery.transport:AmqpSSLTransport"
TRANSPORT_SQS = "delay_broker.celery.transport:SQSTransport"

__all__ = [
    "DEFAULT_NAMESPACE",
    "DEFAULT_THRESHOLDS",
    "OPTIONS_KEY",
    "TRANSPORT_AMQP",
    "TRANSPORT_AMQPS",
    "TRANSPORT_REDIS",
    "TRANSPORT_SENTINEL",
    "TRANSPORT_SQS",
    "CeleryOptions",
    "app_options",
    "build_promoter",
    "cancel",
    "get",
    "install",
    "parse_options",
    "reschedule",
    "runtime_schedules",
    "schedule",
    "schedules_of",
    "store_for",
    "transport_kind",
    "validate",
]
