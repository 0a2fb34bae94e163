"""Delays as Dramatiq gives them, and the threshold above which a delayed message is parked.

Two units meet here and are kept apart on purpose:

- a message's ``delay`` is in **milliseconds** (an int, or a timedelta), exactly as Dramatiq's
  ``send_with_options(delay=...)`` and ``broker.enqueue(message, delay=...)`` take it;
- the middleware's ``threshold`` is configuration and is given in **seconds** (a number, or a timedelta),
  like every other duration in delay_broker.
"""

from __future__ import annotations

import logging
from datetime import timedelta

import dramatiq

from ..clock import delay_to_ms
from ..errors import ConfigurationError, InvalidDelay

logger = logging.getLogger("delay_broker.dramatiq")

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


RABBITMQ_CONSUMER_TIMEOUT_MS = 30 * 60 * 1000
"""RabbitMQ's default ``consumer_timeout``. Set on the server: a client cannot read it."""


def check_consumer_timeout(broker: dramatiq.Broker, threshold_ms: int, consumer_timeout_ms: int | bool | None) -> bool:
    """Warn when a RabbitmqBroker's workers would hold a delayed message past RabbitMQ's ``consumer_timeout``.

    A message delayed by up to the threshold is not parked: a Dramatiq worker consumes it from the delay queue
    and holds it unacknowledged until its eta. RabbitMQ closes the channel of a consumer that holds a delivery
    longer than ``consumer_timeout`` and redelivers what it held. The other brokers need no check: SQS keeps
    delays of up to 900 s itself (``DelaySeconds``, the message is invisible, no worker holds it), and
    RedisBroker has no visibility timeout (a live worker's unacked messages are never given to another).

    ``consumer_timeout_ms``: the server's setting when known (None: RabbitMQ's default; False: turned off).
    Returns whether it warned.
    """
    try:
        from dramatiq.brokers.rabbitmq import RabbitmqBroker
    except ImportError:  # pragma: no cover - pika not installed
        return False
    if not isinstance(broker, RabbitmqBroker) or consumer_timeout_ms is False:
        return False
    timeout = RABBITMQ_CONSUMER_TIMEOUT_MS if consumer_timeout_ms is None else int(consumer_timeout_ms)
    if threshold_ms < timeout:
        return False
    logger.warning(
        "DelayMiddleware threshold of %g s is not below RabbitMQ's consumer_timeout of %g s (%s): a worker holds a "
        "message delayed by less than the threshold, unacknowledged, until it is due; past consumer_timeout "
        "RabbitMQ closes its channel and redelivers it, so it may run twice. Lower the threshold (longer delays "
        "are parked), or raise the server's consumer_timeout and state it with DelayMiddleware(consumer_timeout=...).",
        threshold_ms / 1000,
        timeout / 1000,
        "RabbitMQ's default" if consumer_timeout_ms is None else "as stated",
    )
    return True


def refuse_what_sqs_would(broker: dramatiq.Broker, encoded: bytes) -> None:
    """Raise dramatiq-sqs's ``MessageTooLarge`` for a message the SQS broker would refuse when it is due: a
    park must fail where a plain send fails, not turn into a dead letter days later."""
    if native_cap_ms(broker) is None:
        return
    from base64 import b64encode

    from dramatiq_sqs.exceptions import MessageTooLarge

    limit = int(broker.max_message_size)  # type: ignore[attr-defined]
    size = len(b64encode(encoded))
    if size > limit:
        raise MessageTooLarge(
            f"Messages in SQS can be at most {limit} bytes large once base64-encoded; this one would be {size}."
        )
