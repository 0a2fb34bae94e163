"""Delayed messages a worker receives from the broker: parked instead of held in the worker's memory.

A message delayed by a producer without delay_broker (or sent before it was turned on) reaches a worker from the
broker's delay queue (``<queue>.DQ``) with an ``eta``. Dramatiq's consumer thread then keeps it, unacknowledged,
in an in-memory priority queue until the eta, and calls ``before_delay_message`` just before. No hook can stop
that: an exception there stops the consumer. So the hook parks the message (same id, due at its ``eta``, in the
form it will be enqueued in when due) and then makes the consumer hand it back at once: the eta becomes 0 and a
marker tells the middleware's ``enqueue`` to drop the copy the consumer then enqueues, after which the consumer
acknowledges the message as it acknowledges every delayed message it enqueued.

The park comes first and keeps what the store already holds (``on_conflict="keep"``): a worker killed between
the park and the acknowledgement leaves the message in the broker, which delivers it again, and that delivery
finds it parked and parks nothing twice.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any, cast

import dramatiq
from dramatiq.errors import QueueNotFound

from ..clock import ms_to_datetime
from ..envelope import Envelope
from ..errors import DelayBrokerError
from ..store import DelayStore

logger = logging.getLogger("delay_broker.dramatiq")

AnyMessage = dramatiq.Message[Any]

PARKED_ON_RECEIPT = "delay_broker_parked_on_receipt"
"""Option of a received message this worker parked: the consumer's copy of it is not enqueued (it is in the
store). Set in the worker's memory only; the broker's copy never carries it."""


def eta_of(message: AnyMessage) -> int | None:
    """The message's ``eta`` option in milliseconds, or None when it has none Dramatiq would wait for."""
    eta = message.options.get("eta")
    if isinstance(eta, bool) or not isinstance(eta, int | float) or not math.isfinite(eta):
        return None
    return math.ceil(eta)


def park_on_receipt(
    store: DelayStore,
    threshold_ms: int,
    envelope_of: Callable[[AnyMessage], tuple[AnyMessage, Envelope]],
    message: dramatiq.MessageProxy,
) -> bool:
    """Park a received ``message`` whose eta is more than ``threshold_ms`` away, and arrange for the consumer to
    acknowledge it at once instead of holding it. Returns whether it was parked.

    ``envelope_of`` gives the message as it is to be enqueued when due, and its envelope (the middleware's). When
    the store refuses or cannot be reached, the message is left to Dramatiq, which holds it as it always did.
    """
    plain = cast(AnyMessage, getattr(message, "_message", message))
    due_ms = eta_of(plain)
    # By the worker's clock, as Dramatiq decides when the message is due: no round trip for a short delay.
    if due_ms is None or due_ms - time.time() * 1000 <= threshold_ms:
        return False
    try:
        parked, envelope = envelope_of(plain)
        result = store.park(parked.message_id, envelope, due=ms_to_datetime(due_ms), on_conflict="keep")
    except (QueueNotFound, DelayBrokerError) as error:
        logger.warning(
            "Could not park received message %s (due at %d ms): the worker holds it until due, as Dramatiq does (%s).",
            message.message_id,
            due_ms,
            error,
        )
        return False
    logger.debug(
        "Parked received message %s until %s (%s); acknowledging it.", message.message_id, due_ms, result.outcome
    )
    # The consumer puts the message in its delay queue with this eta right after the hook: due at once, it is
    # handed back in the same pass, its copy dropped by the enqueue (marker) and the message acknowledged.
    message.options["eta"] = 0
    message.options[PARKED_ON_RECEIPT] = True
    return True


def parked_on_receipt(message: AnyMessage, delay: object) -> bool:
    """Whether an ``enqueue(message, delay=delay)`` is the consumer handing back a message parked on receipt."""
    return delay is None and bool(message.options.get(PARKED_ON_RECEIPT))
