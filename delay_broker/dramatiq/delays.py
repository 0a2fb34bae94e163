"""Delays as Dramatiq gives them, and the threshold above which a delayed message is parked.

Two units meet here and are kept apart on purpose:

- a message's ``delay`` is in **milliseconds** (an int, or a timedelta), exactly as Dramatiq's
  ``send_with_options(delay=...)`` and ``broker.enqueue(message, delay=...)`` take it;
- the middleware's ``threshold`` is configuration and is given in **seconds** (a number, or a timedelta),
  like every other duration in delay_broker.
"""

from __future__ import annotations

from datetime import timedelta

import dramatiq

from ..clock import delay_to_ms
from ..errors import ConfigurationError, InvalidDelay

DEFAULT_THRESHOLD = timedelta(seconds=60)
"""Threshold for brokers without a native delay limit (RedisBroker, RabbitmqBroker, StubBroker).

A natively delayed Dramatiq message waits unacknowledged in a worker's memory until it is due; past about a
minute that costs more (memory, redelivery on restart, RabbitMQ's ``consumer_timeout``) than a park does.
"""

SQS_MAX_DELAY_MS = 15 * 60 * 1000
"""SQS refuses ``DelaySeconds`` above 900; dramatiq-sqs raises ``MessageDelayTooLong`` for longer delays."""


def delay_ms(delay: object) -> int:
    """Normalize a Dramatiq delay (milliseconds as a real number, or a timedelta) to whole milliseconds,
    rounded up; :class:`InvalidDelay` naming the problem otherwise (see :func:`delay_broker.clock.delay_to_ms`)."""
    return delay_to_ms(delay, unit="milliseconds")


def threshold_ms(threshold: object) -> int:
    """Normalize the configured threshold (seconds or a timedelta) to milliseconds."""
    try:
        return delay_to_ms(threshold)
    except InvalidDelay as error:
        raise ConfigurationError(f"threshold: {error} (give seconds or a timedelta)") from None


def native_cap_ms(broker: dramatiq.Broker) -> int | None:
    """The longest delay the broker itself accepts, or None when it has no limit of its own."""
    try:
        from dramatiq_sqs import SQSBroker
    except ImportError:  # pragma: no cover - depends on the install
        return None
    return SQS_MAX_DELAY_MS if isinstance(broker, SQSBroker) else None


def effective_threshold_ms(broker: dramatiq.Broker, configured_ms: int | None) -> int:
    """The threshold in force on ``broker``: the configured one, never above the broker's native cap."""
    cap = native_cap_ms(broker)
    if configured_ms is None:
        return cap if cap is not None else threshold_ms(DEFAULT_THRESHOLD)
    return configured_ms if cap is None else min(configured_ms, cap)
