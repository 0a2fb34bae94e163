"""The SQS transport that parks long-delayed tasks (a separate module: importing kombu's SQS needs boto3)."""

from __future__ import annotations

from typing import Any

from kombu.transport import SQS as kombu_sqs

from .transport import DelayBrokerTransport, WatchesRevokes, _park_virtual


class SQSChannel(WatchesRevokes, kombu_sqs.Channel):
    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> Any:
        # SQS has no priority lists: the route is the kombu queue name (before the queue-name prefix).
        if _park_virtual(self, queue, message, queue):
            return None
        return super()._put(queue, message, **kwargs)  # type: ignore[no-untyped-call]


class SQSTransport(DelayBrokerTransport, kombu_sqs.Transport):
    """kombu's SQS transport, parking tasks whose eta is further away than the threshold (default 900 s)."""

    Channel = SQSChannel
    delay_broker_kind = "sqs"
