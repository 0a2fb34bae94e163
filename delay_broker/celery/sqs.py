"""The SQS transport that parks long-delayed tasks (a separate module: importing kombu's SQS needs boto3)."""

from __future__ import annotations

import base64
from typing import Any

from kombu.transport import SQS as kombu_sqs
from kombu.utils.json import dumps

from ..errors import PayloadTooLarge
from ..sqs_errors import MAX_MESSAGE_BYTES
from .transport import DelayBrokerTransport, WatchesRevokes, _park_virtual


class SQSChannel(WatchesRevokes, kombu_sqs.Channel):
    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> Any:
        # SQS has no priority lists: the route is the kombu queue name (before the queue-name prefix).
        if _park_virtual(self, queue, message, queue, self._refuse_what_sqs_would):
            return None
        return super()._put(queue, message, **kwargs)  # type: ignore[no-untyped-call]

    def _refuse_what_sqs_would(self, message: dict[str, Any]) -> None:
        """A task SQS would refuse when due is refused now, as a task sent straight to SQS is: measured as
        kombu will send it (JSON, then base64 unless ``sqs_base64_encoding`` is off), attributes included."""
        body = dumps(message).encode()  # type: ignore[no-untyped-call]
        size = len(base64.b64encode(body)) if self.sqs_base64_encoding else len(body)
        if size > MAX_MESSAGE_BYTES:
            raise PayloadTooLarge(
                f"task {message.get('headers', {}).get('id')!r} would be a message of {size:,} bytes for SQS, over "
                f"its limit of {MAX_MESSAGE_BYTES:,}: SQS would refuse it when due"
            )


class SQSTransport(DelayBrokerTransport, kombu_sqs.Transport):
    """kombu's SQS transport, parking tasks whose eta is further away than the threshold (default 900 s)."""

    Channel = SQSChannel
    delay_broker_kind = "sqs"
