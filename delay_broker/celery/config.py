"""Options of the Celery adapter: ``broker_transport_options["delay_broker"]``, parsed and checked up front.

Neither Celery nor kombu validates transport options (unknown keys are silently ignored), so this module
checks our sub-dictionary itself and raises :class:`~delay_broker.errors.ConfigurationError` naming the bad
key. It is called when a transport is created (worker start-up, first publish), by :func:`install` and by
:func:`validate`: a typo surfaces at start-up, never as a silently unparked task.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..connect import check_url
from ..errors import ConfigurationError
from ..keys import MAX_SHARDS, Keyspace

Kind = Literal["redis", "sentinel", "amqp", "sqs"]
"""The brokers we wrap: Redis (``redis://``), Redis behind Sentinel (``sentinel://``), RabbitMQ, SQS."""

OPTIONS_KEY = "delay_broker"
"""The key of our options inside ``app.conf.broker_transport_options``."""

DEFAULT_NAMESPACE = "celery"
"""Celery's own namespace, so a Dramatiq promoter sharing the Redis never claims Celery messages."""

DEFAULT_THRESHOLDS: dict[str, float] = {"redis": 60.0, "sentinel": 60.0, "amqp": 60.0, "sqs": 900.0}
"""Seconds of delay above which a task is parked, per transport. SQS: its own ``DelaySeconds`` cap."""

"""Our multi-host store URLs (see :mod:`delay_broker.connect`)."""


@dataclass(frozen=True)
class CeleryOptions:
    """The parsed ``delay_broker`` transport options (the README's Celery section has the reference)."""

    enabled: bool = True
    redis_url: str | None = None
    namespace: str = DEFAULT_NAMESPACE
    threshold: float | None = None
    promoter: bool = True
    batch: int = 200
    lease: float = 30.0
    max_idle: float = 5.0
    max_attempts: int = 5
    queues: tuple[str, ...] = ()
    revoke: bool = True
    metrics_port: int | None = None
    shards: int | None = None
    replicas: int = 0
    replica_timeout: float = 1.0

    def store_options(self) -> dict[str, Any]:
        """The :class:`~delay_broker.store.DelayStore` arguments these options give."""
        return {
            "namespace": self.namespace,
            "max_attempts": self.max_attempts,
            "shards": self.shards,
            "replicas": self.replicas,
            "replica_timeout": self.replica_timeout,
        }

    def threshold_for(self, kind: Kind) -> float:
        return DEFAULT_THRESHOLDS[kind] if self.threshold is None else self.threshold


def _bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ConfigurationError(f"delay_broker option {name!r} must be True or False, got {value!r}")
    return value


def _seconds(name: str, value: object, *, minimum: float, inclusive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigurationError(
            f"delay_broker option {name!r} must be a number of seconds, got {type(value).__name__} {value!r}"
        )
    seconds = float(value)
    if math.isnan(seconds) or math.isinf(seconds) or seconds < minimum or (not inclusive and seconds == minimum):
        relation = ">=" if inclusive else ">"
        raise ConfigurationError(f"delay_broker option {name!r} must be finite and {relation} {minimum}, got {value!r}")
    return seconds


def _int(name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigurationError(f"delay_broker option {name!r} must be an integer from {low} to {high}, got {value!r}")
    return value


def check_redis_url(url: object, what: str = "redis_url") -> str:
    """A store URL :func:`delay_broker.connect.client_from_url` takes, or a ConfigurationError naming the option.
    Nothing is connected to."""
    if not isinstance(url, str) or not url:
        raise ConfigurationError(f"delay_broker option {what!r} must be a non-empty URL string, got {url!r}")
    try:
        return check_url(url)
    except ConfigurationError as error:
        raise ConfigurationError(f"delay_broker option {what!r}: {error}") from None


def parse_options(raw: object) -> CeleryOptions:
    """Check and parse the ``delay_broker`` sub-dictionary; raises ConfigurationError on any problem."""
    if raw is None:
        return CeleryOptions()
    if not isinstance(raw, Mapping):
        raise ConfigurationError(f"broker_transport_options[{OPTIONS_KEY!r}] must be a dict, got {type(raw).__name__}")
    known = set(CeleryOptions.__dataclass_fields__)
    unknown = sorted(str(key) for key in raw if key not in known)
    if unknown:
        raise ConfigurationError(
            f"unknown delay_broker option(s) {', '.join(map(repr, unknown))}; known: {', '.join(sorted(known))}"
        )
    values: dict[str, Any] = {}
    for name, value in raw.items():
        if name in ("enabled", "promoter", "revoke"):
            values[name] = _bool(name, value)
        elif name == "redis_url":
            values[name] = None if value is None else check_redis_url(value)
        elif name == "namespace":
            if not isinstance(value, str):
                raise ConfigurationError(f"delay_broker option 'namespace' must be a string, got {value!r}")
            try:
                Keyspace(value)
            except ValueError as error:
                raise ConfigurationError(f"delay_broker option 'namespace': {error}") from None
            values[name] = value
        elif name == "threshold":
            values[name] = None if value is None else _seconds(name, value, minimum=0.0, inclusive=True)
        elif name in ("lease", "max_idle", "replica_timeout"):
            values[name] = _seconds(name, value, minimum=0.0, inclusive=False)
        elif name in ("batch", "max_attempts"):
            values[name] = _int(name, value, 1, 1000)
        elif name == "metrics_port":
            values[name] = None if value is None else _int(name, value, 0, 65535)
        elif name == "shards":
            values[name] = None if value is None else _int(name, value, 1, MAX_SHARDS)
        elif name == "replicas":
            values[name] = _int(name, value, 0, 100)
        elif name == "queues":
            if isinstance(value, str) or not isinstance(value, list | tuple | set | frozenset):
                raise ConfigurationError(f"delay_broker option 'queues' must be a list of queue names, got {value!r}")
            if not all(isinstance(item, str) and item for item in value):
                raise ConfigurationError(f"delay_broker option 'queues' must hold non-empty strings, got {value!r}")
            values[name] = tuple(sorted(value))
    return CeleryOptions(**values)


def options_of(transport_options: Mapping[str, Any] | None) -> CeleryOptions:
    """Our options from a kombu/Celery ``transport_options`` dict."""
    return parse_options((transport_options or {}).get(OPTIONS_KEY))


def kind_of_scheme(scheme: str) -> Kind | None:
    """The transport kind a broker URL scheme selects (None: a transport we do not wrap)."""
    scheme = scheme.lower()
    if scheme in ("redis", "rediss"):
        return "redis"
    if scheme in ("amqp", "amqps", "pyamqp"):
        return "amqp"
    if scheme == "sentinel":
        return "sentinel"
    if scheme == "sqs":
        return "sqs"
    return None
