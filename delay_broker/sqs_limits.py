"""The largest message an SQS queue takes: the sending client's limit, or the queue's own ``MaximumMessageSize``
when that is lower.

A parked message reaches SQS only when it is due; refused then, it is dead-lettered, too late to tell whoever
sent it. So a park is checked against what the queue will take. Queues created before AWS raised the limit to
1 MiB (August 2025) keep 262144 bytes, and any queue may be set lower (1024 at least). The attribute is read
with one ``GetQueueAttributes`` per queue and kept for the life of the process: read on every park, it would
double what a park costs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from .sqs_errors import is_outage

logger = logging.getLogger("delay_broker.sqs")

SMALLEST_QUEUE_LIMIT = 1024
"""The lowest ``MaximumMessageSize`` SQS allows: no queue refuses a smaller message, so none is looked up."""

READ_AGAIN_AFTER = 60.0
"""Seconds before a read that failed because SQS was unreachable is tried again (a refusal is not)."""

MISSING_QUEUE_CODES = frozenset({"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"})


class QueueLimits:
    """Each queue's ``MaximumMessageSize``, read once and kept; thread-safe (Dramatiq parks from many threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sizes: dict[str, int | None] = {}  # None: unreadable for good (no permission), the client's limit
        self._read_again_at: dict[str, float] = {}  # unreadable for now (SQS unreachable)
        self._warned: set[str] = set()

    def limit(self, key: str, client_limit: int, read: Callable[[], int | None]) -> int:
        """The smaller of ``client_limit`` and the queue's own limit. ``key`` names the queue; ``read`` returns
        its ``MaximumMessageSize``, or None when the queue does not exist yet (it is asked again next time).
        A read that fails falls back to ``client_limit`` with one warning: never a reason to refuse a send."""
        with self._lock:
            if key in self._sizes:
                known = self._sizes[key]
                return client_limit if known is None else min(client_limit, known)
            if time.monotonic() < self._read_again_at.get(key, 0.0):
                return client_limit
        try:
            size = read()
        except Exception as error:  # whatever went wrong, the send goes on with the client's limit
            self._failed(key, client_limit, error)
            return client_limit
        if size is None:
            return client_limit
        with self._lock:
            self._sizes[key] = size
            self._read_again_at.pop(key, None)
        return min(client_limit, size)

    def _failed(self, key: str, client_limit: int, error: BaseException) -> None:
        transient = is_outage(error)
        with self._lock:
            if transient:
                self._read_again_at[key] = time.monotonic() + READ_AGAIN_AFTER
            else:
                self._sizes[key] = None
            if key in self._warned:
                return
            self._warned.add(key)
        logger.warning(
            "Could not read the MaximumMessageSize of SQS queue %s (%s: %s); parked messages for it are checked "
            "against the client's limit of %d bytes only, and one over the queue's own limit will be "
            "dead-lettered when due.%s",
            key,
            type(error).__name__,
            error,
            client_limit,
            " Will read it again later." if transient else " Grant sqs:GetQueueAttributes to check it at send time.",
        )


LIMITS = QueueLimits()
"""One for the process: both adapters' producers, however many brokers, connections and channels they open."""


def maximum_message_size(client: Any, queue_url: str) -> int:
    """The queue's ``MaximumMessageSize`` attribute (one ``GetQueueAttributes``)."""
    reply = client.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["MaximumMessageSize"])
    return int(reply["Attributes"]["MaximumMessageSize"])


def is_missing_queue(error: BaseException) -> bool:
    """True for SQS's reply that the queue does not exist."""
    if not type(error).__module__.startswith("botocore"):
        return False
    from botocore.exceptions import ClientError

    return isinstance(error, ClientError) and (error.response or {}).get("Error", {}).get("Code") in MISSING_QUEUE_CODES
