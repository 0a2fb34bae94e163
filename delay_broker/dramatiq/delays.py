"""Delays as Dramatiq gives them, and the threshold above which a delayed message is parked.

Two units meet here and are kept apart on purpose:

- a message's ``delay`` is in **milliseconds** (an int, or a timedelta), exactly as Dramatiq's
  ``send_with_options(delay=...)`` and ``broker.enqueue(message, delay=...)`` take it;
- the middleware's ``threshold`` is configuration and is given in **seconds** (a number, or a timedelta),
  like every other duration in delay_broker.
"""

from __future__ import annotations

import logging
import sys
from datetime import timedelta
from typing import Any

import dramatiq

from ..clock import delay_to_ms
from ..errors import ConfigurationError, InvalidDelay
from ..sqs_limits import LIMITS, SMALLEST_QUEUE_LIMIT, is_missing_queue, maximum_message_size

logger = logging.getLogger("delay_broker.dramatiq")

DEFAULT_THRESHOLD = timedelta(seconds=60)
"""Threshold for brokers without a native delay limit (RedisBroker, RabbitmqBroker, StubBroker).

A natively delayed Dramatiq message waits unacknowledged in a worker's memory until it is due; past about a
minute that costs more (memory, redelivery on restart, RabbitMQ's ``consumer_timeout``) than a park does.
"""

SQS_MAX_DELAY_MS = 15 * 60 * 1000
"""SQS refuses ``DelaySeconds`` above 900; dramatiq-sqs raises ``MessageDelayTooLong`` for longer delays (a
ValueError before 0.4.1)."""


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


def _broker_class(module: str, name: str) -> type | None:
    """A broker class, when its module is imported already: a broker of it can only exist then, and importing
    dramatiq-sqs (boto3) or the RabbitMQ broker (pika) to rule it out weighed every worker 16 MB."""
    loaded = sys.modules.get(module)
    found = getattr(loaded, name, None)
    return found if isinstance(found, type) else None


def native_cap_ms(broker: dramatiq.Broker) -> int | None:
    """The longest delay the broker itself accepts, or None when it has no limit of its own."""
    sqs = _broker_class("dramatiq_sqs", "SQSBroker")
    return SQS_MAX_DELAY_MS if sqs is not None and isinstance(broker, sqs) else None


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
    rabbitmq = _broker_class("dramatiq.brokers.rabbitmq", "RabbitmqBroker")
    if rabbitmq is None or not isinstance(broker, rabbitmq) or consumer_timeout_ms is False:
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


def sqs_too_large() -> type[Exception]:
    """The exception the installed dramatiq-sqs's ``enqueue`` raises for a message over its size limit."""
    try:
        from dramatiq_sqs import MessageTooLarge
    except ImportError:  # dramatiq-sqs 0.2 to 0.4.0: no exceptions module, a plain RuntimeError
        return RuntimeError
    too_large: type[Exception] = MessageTooLarge
    return too_large


def sqs_client_limit(broker: dramatiq.Broker) -> int:
    """The most base64 bytes the installed dramatiq-sqs's ``enqueue`` takes in one message on ``broker``."""
    limit = getattr(broker, "max_message_size", None)  # dramatiq-sqs 0.4.4 on: set per broker
    if limit is not None:
        return int(limit)
    from dramatiq_sqs import broker as sqs_broker

    # A module constant before: 1 MiB from 0.3 on, 256 KiB in 0.2 (SQS's limit until 2025).
    return int(getattr(sqs_broker, "MAX_MESSAGE_SIZE_BYTES", None) or sqs_broker.MAX_MESSAGE_SIZE)


def refuse_what_sqs_would(broker: dramatiq.Broker, encoded: bytes, queue_name: str) -> None:
    """Raise what dramatiq-sqs's ``enqueue`` raises (``MessageTooLarge``, a RuntimeError before 0.4.1) for a
    message the SQS broker would refuse when it is due: a park must fail where a plain send fails, not turn
    into a dead letter days later. Each dramatiq-sqs version is held to its own limit, as its ``enqueue`` is,
    and every version to the queue's ``MaximumMessageSize`` (SQS refuses what exceeds it; a plain send then
    fails with botocore's ``ClientError``, a park with the same exception as for the client's limit)."""
    if native_cap_ms(broker) is None:
        return
    from base64 import b64encode

    limit = sqs_client_limit(broker)
    size = len(b64encode(encoded))
    if size > limit:
        raise sqs_too_large()(
            f"Messages in SQS can be at most {limit} bytes large once base64-encoded; this one would be {size}."
        )
    if size <= SMALLEST_QUEUE_LIMIT:
        return
    queue = sqs_queue_limit(broker, queue_name, limit)
    if size > queue:
        raise sqs_too_large()(
            f"Messages in SQS can be at most {queue} bytes large on queue {queue_name!r} (its MaximumMessageSize) "
            f"once base64-encoded; this one would be {size}."
        )


def sqs_queue_limit(broker: dramatiq.Broker, queue_name: str, client_limit: int) -> int:
    """The smaller of ``client_limit`` and the SQS queue's own ``MaximumMessageSize`` (read once per queue)."""
    sqs: Any = broker
    client = sqs.sqs.meta.client
    # As dramatiq-sqs 0.4 on names it; the versions before create every declared queue, so never look it up.
    sqs_name = f"{sqs.namespace}_{queue_name}" if sqs.namespace else queue_name

    def read() -> int | None:
        # dramatiq-sqs keeps a boto3 Queue for each queue declared (before 0.4) or used (0.4 on) here.
        queue = sqs.queues.get(queue_name)
        if queue is not None:
            url = queue.url
        else:
            try:
                url = client.get_queue_url(QueueName=sqs_name)["QueueUrl"]
            except Exception as error:
                if is_missing_queue(error):
                    return None  # dramatiq-sqs creates it at the first send, with SQS's default limit
                raise
        return maximum_message_size(client, url)

    return LIMITS.limit(f"{client.meta.endpoint_url} {sqs_name}", client_limit, read)
