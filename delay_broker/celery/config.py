"""Options of the Celery adapter: ``broker_transport_options["delay_broker"]``, parsed and checked up front.

Neither Celery nor kombu validates transport options (unknown keys are silently ignored), so this module
checks our sub-dictionary itself and raises :class:`~delay_broker.errors.ConfigurationError` naming the bad
key. It is called when a transport is created (worker start-up, first publish), by :func:`install` and by
:func:`validate`: a typo surfaces at start-up, never as a silently unparked task.
"""

from __future__ import annotations

import logging
import math
import numbers
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..connect import check_url
from ..errors import ConfigurationError
from ..keys import MAX_SHARDS, Keyspace
from ..once import default_window, window_too_short
from ..store import DEFAULT_MAX_PAYLOAD, DEFAULT_PACK_AFTER_MS, MAX_AHEAD

logger = logging.getLogger("delay_broker.celery")

Kind = Literal["redis", "sentinel", "amqp", "sqs"]
"""The brokers we wrap: Redis (``redis://``), Redis behind Sentinel (``sentinel://``), RabbitMQ, SQS."""

OPTIONS_KEY = "delay_broker"
"""The key of our options inside ``app.conf.broker_transport_options``."""

DEFAULT_NAMESPACE = "celery"
"""Celery's own namespace, so a Dramatiq promoter sharing the Redis never claims Celery messages."""

DEFAULT_THRESHOLDS: dict[str, float] = {"redis": 60.0, "sentinel": 60.0, "amqp": 60.0, "sqs": 900.0}
"""Seconds of delay above which a task is parked, per transport. SQS: its own ``DelaySeconds`` cap."""

DEFAULT_VISIBILITY_TIMEOUTS: dict[str, float] = {"redis": 3600.0, "sentinel": 3600.0, "sqs": 1800.0}
"""kombu's ``visibility_timeout`` when the transport option is not set: ``kombu.transport.redis.Channel`` has
3600 s; ``kombu.transport.SQS.Channel.default_visibility_timeout`` (1800 s) is what kombu gives the queues it
creates. A worker holds a task whose eta is up to ``threshold`` away; once it has held it for the visibility
timeout the broker hands it to another worker as well: the duplicates delay_broker exists to prevent."""

RABBITMQ_CONSUMER_TIMEOUT = 1800.0
"""RabbitMQ's default ``consumer_timeout`` (30 min): a delivery left unacknowledged longer makes the broker
close the channel and redeliver everything it held. Set on the server, so a client cannot read it."""

DEFAULT_PROMOTE_AHEAD = 1.0
"""Seconds before its eta a parked task goes to the broker. Workers hold a task until its eta, so it still runs
then; in the meantime the worker has received it, and a batch due together runs at its eta instead of after the
time it takes to fetch it (what native ETA tasks, fetched long before, never pay)."""

RECEIPT_SLACK = 5.0
"""Seconds past ``promote_ahead`` within which a worker does not park a task it receives: one promoted ahead must
not be parked again, even by a worker whose clock is a few seconds behind the store's Redis."""

TRANSPORT_MODULE = "delay_broker.celery.transport"
TRANSPORTS: dict[str, str] = {
    "redis": f"{TRANSPORT_MODULE}:RedisTransport",
    "sentinel": f"{TRANSPORT_MODULE}:SentinelTransport",
    "amqp": f"{TRANSPORT_MODULE}:AmqpTransport",
    "amqps": f"{TRANSPORT_MODULE}:AmqpSSLTransport",
    "sqs": f"{TRANSPORT_MODULE}:SQSTransport",
}
"""The ``broker_transport`` value for each kind of broker (``amqps``: RabbitMQ over TLS)."""


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
    reliable_fetch: bool = True
    metrics_port: int | None = None
    shards: int | None = None
    replicas: int = 0
    replica_timeout: float = 1.0
    max_delay: float | None = None
    dead_max_count: int | None = None
    dead_max_age: float | None = None
    consumer_timeout: float | Literal[False] | None = None
    far_tier: str | None = None
    far_horizon: float | None = None
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD
    pack_after: float | None = DEFAULT_PACK_AFTER_MS / 1000
    inspect_limit: int = 1000
    promote_ahead: float = DEFAULT_PROMOTE_AHEAD
    once: bool = False
    once_window: float | None = None

    def store_options(self) -> dict[str, Any]:
        """The :class:`~delay_broker.store.DelayStore` arguments these options give."""
        return {
            "namespace": self.namespace,
            "max_attempts": self.max_attempts,
            "shards": self.shards,
            "replicas": self.replicas,
            "replica_timeout": self.replica_timeout,
            "max_delay": self.max_delay,
            "dead_max_count": self.dead_max_count,
            "dead_max_age": self.dead_max_age,
            "far_tier": self.far_tier,
            "far_horizon": self.far_horizon,
            "max_payload_bytes": self.max_payload_bytes,
            "pack_after": self.pack_after,
        }

    def threshold_for(self, kind: Kind) -> float:
        return DEFAULT_THRESHOLDS[kind] if self.threshold is None else self.threshold


Check = Callable[[str, object], Any]
"""Checks one option: ``(name, value)`` -> the parsed value, or a ConfigurationError naming the option."""


def _bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ConfigurationError(f"delay_broker option {name!r} must be True or False, got {value!r}")
    return value


def _seconds(minimum: float, *, inclusive: bool) -> Check:
    """A finite number of seconds from ``minimum`` (or above it, when not ``inclusive``)."""

    def check(name: str, value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ConfigurationError(
                f"delay_broker option {name!r} must be a number of seconds, got {type(value).__name__} {value!r}"
            )
        seconds = float(value)
        if not math.isfinite(seconds) or seconds < minimum or (not inclusive and seconds == minimum):
            relation = ">=" if inclusive else ">"
            raise ConfigurationError(
                f"delay_broker option {name!r} must be finite and {relation} {minimum}, got {value!r}"
            )
        return seconds

    return check


def _int(low: int, high: int) -> Check:
    """An integer from ``low`` to ``high``."""

    def check(name: str, value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ConfigurationError(
                f"delay_broker option {name!r} must be an integer from {low} to {high}, got {value!r}"
            )
        return value

    return check


def _optional(check: Check) -> Check:
    """``check``, with None allowed (the option's default: not set)."""
    return lambda name, value: None if value is None else check(name, value)


def check_redis_url(url: object, what: str = "redis_url") -> str:
    """A store URL :func:`delay_broker.connect.client_from_url` takes, or a ConfigurationError naming the option.
    Nothing is connected to."""
    if not isinstance(url, str) or not url:
        raise ConfigurationError(f"delay_broker option {what!r} must be a non-empty URL string, got {url!r}")
    try:
        return check_url(url)
    except ConfigurationError as error:
        raise ConfigurationError(f"delay_broker option {what!r}: {error}") from None


def _namespace(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise ConfigurationError(f"delay_broker option {name!r} must be a string, got {value!r}")
    try:
        Keyspace(value)
    except ValueError as error:
        raise ConfigurationError(f"delay_broker option {name!r}: {error}") from None
    return value


def _far_tier(name: str, value: object) -> str | None:
    if value is not None and not (isinstance(value, str) and value.startswith(("postgresql://", "postgres://"))):
        raise ConfigurationError(f"delay_broker option {name!r} must be a postgresql:// URL, got {value!r}")
    return value


def _consumer_timeout(name: str, value: object) -> float | Literal[False] | None:
    # False: the server's consumer_timeout is turned off; None: RabbitMQ's default.
    if value is None or value is False:
        return value
    seconds: float = _seconds(0.0, inclusive=False)(name, value)
    return seconds


def _ahead(name: str, value: object) -> float:
    seconds: float = _seconds(0.0, inclusive=True)(name, value)
    if seconds > MAX_AHEAD:
        raise ConfigurationError(f"delay_broker option {name!r} must be at most {MAX_AHEAD:g} s, got {value!r}")
    return seconds


def _queues(name: str, value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, list | tuple | set | frozenset):
        raise ConfigurationError(f"delay_broker option {name!r} must be a list of queue names, got {value!r}")
    if not all(isinstance(item, str) and item for item in value):
        raise ConfigurationError(f"delay_broker option {name!r} must hold non-empty strings, got {value!r}")
    return tuple(sorted(value))


CHECKS: dict[str, Check] = {
    "enabled": _bool,
    "redis_url": _optional(lambda _, value: check_redis_url(value)),
    "namespace": _namespace,
    "threshold": _optional(_seconds(0.0, inclusive=True)),
    "promoter": _bool,
    "batch": _int(1, 1000),
    "lease": _seconds(0.0, inclusive=False),
    "max_idle": _seconds(0.0, inclusive=False),
    "max_attempts": _int(1, 1000),
    "queues": _queues,
    "revoke": _bool,
    "reliable_fetch": _bool,
    "metrics_port": _optional(_int(0, 65535)),
    "shards": _optional(_int(1, MAX_SHARDS)),
    "replicas": _int(0, 100),
    "replica_timeout": _seconds(0.0, inclusive=False),
    "max_delay": _optional(_seconds(0.0, inclusive=False)),
    "dead_max_count": _optional(_int(0, 2**53)),
    "dead_max_age": _optional(_seconds(0.0, inclusive=False)),
    "consumer_timeout": _consumer_timeout,
    "far_tier": _far_tier,
    "far_horizon": _optional(_seconds(0.0, inclusive=False)),
    "max_payload_bytes": _int(1, 512 * 1024 * 1024),  # Redis's largest string
    "pack_after": _optional(_seconds(10.0, inclusive=True)),
    "inspect_limit": _int(0, 10_000),
    "promote_ahead": _ahead,
    "once": _bool,
    "once_window": _optional(_seconds(0.0, inclusive=False)),
}
"""How each option of :class:`CeleryOptions` is checked, in its order."""


def parse_options(raw: object) -> CeleryOptions:
    """Check and parse the ``delay_broker`` sub-dictionary; raises ConfigurationError on any problem."""
    if raw is None:
        return CeleryOptions()
    if not isinstance(raw, Mapping):
        raise ConfigurationError(f"broker_transport_options[{OPTIONS_KEY!r}] must be a dict, got {type(raw).__name__}")
    unknown = sorted(str(key) for key in raw if key not in CHECKS)
    if unknown:
        raise ConfigurationError(
            f"unknown delay_broker option(s) {', '.join(map(repr, unknown))}; known: {', '.join(sorted(CHECKS))}"
        )
    return CeleryOptions(**{name: CHECKS[name](name, value) for name, value in raw.items()})


_warned: set[tuple[str, float, float]] = set()
_warned_lock = threading.Lock()


def check_threshold(options: CeleryOptions, kind: Kind, transport_options: Mapping[str, Any] | None) -> None:
    """Check the threshold against how long the broker lets a worker hold a task unacknowledged.

    A task due within ``threshold`` is not parked: Celery's worker receives it at once and holds it,
    unacknowledged, until its eta. On Redis and SQS the broker hands a task held longer than
    ``visibility_timeout`` to another worker, so a threshold at or above it provably brings back the duplicates
    delay_broker exists to prevent: refused with a ConfigurationError. On RabbitMQ a delivery held longer than
    the server's ``consumer_timeout`` closes the channel and is redelivered; the client cannot read the
    server's setting, so it is compared with RabbitMQ's default (or the ``consumer_timeout`` option) and
    logged as a warning, once per process.
    """
    if not options.enabled:
        return
    threshold = options.threshold_for(kind)
    if kind in DEFAULT_VISIBILITY_TIMEOUTS:
        visibility = _visibility_timeout(kind, transport_options)
        if visibility is not None and threshold >= visibility:
            raise ConfigurationError(
                f"delay_broker threshold of {threshold:g} s is not below the {kind} transport's visibility_timeout "
                f"of {visibility:g} s: a task delayed by less than the threshold is held by a worker for longer than "
                "the broker waits before handing it to another worker, so it would run twice. Lower 'threshold' "
                "(tasks delayed longer are parked instead) or raise the transport option 'visibility_timeout'"
            )
        return
    if kind != "amqp" or options.consumer_timeout is False:
        return
    timeout = RABBITMQ_CONSUMER_TIMEOUT if options.consumer_timeout is None else options.consumer_timeout
    if threshold < timeout:
        return
    with _warned_lock:
        if (kind, threshold, timeout) in _warned:
            return
        _warned.add((kind, threshold, timeout))
    stated = "as the 'consumer_timeout' option states" if options.consumer_timeout else "RabbitMQ's default"
    logger.warning(
        "delay_broker threshold of %g s is not below RabbitMQ's consumer_timeout of %g s (%s): a worker holding a "
        "task delayed by less than the threshold past that timeout has its channel closed and the task is "
        "redelivered, so it may run twice. Lower 'threshold' (tasks delayed longer are parked), or raise the "
        "server's consumer_timeout and state it in the 'consumer_timeout' option.",
        threshold,
        timeout,
        stated,
    )


def _visibility_timeout(kind: Kind, transport_options: Mapping[str, Any] | None) -> float | None:
    """The transport's ``visibility_timeout`` in seconds as kombu reads it (None: a value kombu would fail on
    anyway, left for kombu to report)."""
    value = (transport_options or {}).get("visibility_timeout")
    if value is None or value == "":
        return DEFAULT_VISIBILITY_TIMEOUTS[kind]
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(seconds) else seconds


def once_window(options: CeleryOptions, kind: Kind, transport_options: Mapping[str, Any] | None) -> float:
    """The effectively-once window in force: the ``once_window`` option, or one that covers the lease and the
    broker's visibility timeout (Redis, Sentinel, SQS; RabbitMQ redelivers at once). A window given that is too
    short is logged as a warning."""
    redelivery = _visibility_timeout(kind, transport_options) if kind in DEFAULT_VISIBILITY_TIMEOUTS else None
    if options.once_window is None:
        return default_window(options.lease, redelivery)
    problem = window_too_short(options.once_window, options.lease, redelivery)
    if problem:
        logger.warning("delay_broker once: %s ('once_window').", problem)
    return options.once_window


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
