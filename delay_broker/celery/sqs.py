"""The SQS transport that parks long-delayed tasks (a separate module: importing kombu's SQS needs boto3)."""

from __future__ import annotations

from typing import Any

from kombu.transport import SQS as kombu_sqs

from .transport import DelayBrokerTransport, _park_virtual, _watch_control


class SQSChannel(kombu_sqs.Channel):
    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> Any:
        # SQS has no priority lists: the route is the kombu queue name (before the queue-name prefix).
        if _park_virtual(self, queue, message, queue):
            return None
        return super()._put(queue, message, **kwargs)  # type: ignore[no-untyped-call]

    def basic_publish(self, message: dict[str, Any], exchange: str, routing_key: str, **kwargs: Any) -> Any:
        # SQS drops fanout publishes (no SNS), so the revoke broadcast is only visible here.
        body, ctype, cenc = message.get("body"), message.get("content-type"), message.get("content-encoding")
        _watch_control(self.connection.delay_broker, exchange, body, ctype, cenc)
        return super().basic_publish(message, exchange, routing_key, **kwargs)  # type: ignore[no-untyped-call]


class SQSTransport(DelayBrokerTransport, kombu_sqs.Transport):
    """kombu's SQS transport, parking tasks whose eta is further away than the threshold (default 900 s)."""

    Channel = SQSChannel
    delay_broker_kind = "sqs"

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)  # type: ignore[no-untyped-call]
        self._setup_delay_broker(client)
