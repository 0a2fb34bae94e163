"""The SQS transport that parks long-delayed tasks (a separate module: importing kombu's SQS needs boto3)."""

from __future__ import annotations

import base64
from typing import Any

from kombu.transport import SQS as kombu_sqs
from kombu.utils.json import dumps

from ..errors import PayloadTooLarge
from ..sqs_errors import MAX_MESSAGE_BYTES
from ..sqs_limits import LIMITS, SMALLEST_QUEUE_LIMIT, maximum_message_size
from .channels import DelayBrokerTransport, WatchesRevokes, park_virtual


class SQSChannel(WatchesRevokes, kombu_sqs.Channel):
    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> Any:
        # SQS has no priority lists: the route is the kombu queue name (before the queue-name prefix).
        if park_virtual(self, queue, message, queue, lambda parked: self._refuse_what_sqs_would(queue, parked)):
            return None
        return super()._put(queue, message, **kwargs)  # type: ignore[no-untyped-call]

    def _refuse_what_sqs_would(self, queue: str, message: dict[str, Any]) -> None:
        """A task SQS would refuse when due is refused now, as a task sent straight to SQS is: measured as
        kombu will send it (JSON, then base64 unless ``sqs_base64_encoding`` is off), attributes included,
        against SQS's limit and the queue's own ``MaximumMessageSize`` when lower."""
        body = dumps(message).encode()  # type: ignore[no-untyped-call]
        size = len(base64.b64encode(body)) if self.sqs_base64_encoding else len(body)
        limit = MAX_MESSAGE_BYTES
        if MAX_MESSAGE_BYTES >= size > SMALLEST_QUEUE_LIMIT:
            limit = self._queue_limit(queue)
        if size > limit:
            whose = "its limit" if limit == MAX_MESSAGE_BYTES else "the queue's MaximumMessageSize"
            raise PayloadTooLarge(
                f"task {message.get('headers', {}).get('id')!r} would be a message of {size:,} bytes for SQS, over "
                f"{whose} of {limit:,}: SQS would refuse it when due"
            )

    def _queue_limit(self, queue: str) -> int:
        """The queue's ``MaximumMessageSize`` if below SQS's limit, read once per queue for the process."""
        name: str = self.canonical_queue_name(queue)  # type: ignore[no-untyped-call]

        def read() -> int:
            # kombu's own way to the queue (created as a plain send creates it) and its client for that queue.
            url = self._new_queue(queue)  # type: ignore[no-untyped-call]
            return maximum_message_size(self.sqs(queue=name), url)  # type: ignore[no-untyped-call]

        where = f"{self.conninfo.hostname or ''}:{self.conninfo.port or ''}/{self.region}"
        return LIMITS.limit(f"{where} {name}", MAX_MESSAGE_BYTES, read)


class SQSTransport(DelayBrokerTransport, kombu_sqs.Transport):
    """kombu's SQS transport, parking tasks whose eta is further away than the threshold (default 900 s)."""

    Channel = SQSChannel
    delay_broker_kind = "sqs"
