"""What a broker's error means to a promoter: pure units on the libraries' own exceptions, built as SQS replies
(outage, throttling, a message it will never take) and as dramatiq's RabbitmqBroker wraps pika's errors."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from delay_broker import sqs_errors
from delay_broker.dramatiq.delivery import classify
from delay_broker.errors import DeliveryRefused, TargetUnavailable


def reply(status: int, code: str, message: str) -> ClientError:
    response = {"Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": status}}
    return ClientError(response, "SendMessage")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("error", "meaning"),
    [
        (reply(503, "ServiceUnavailable", "Service is unavailable"), TargetUnavailable),
        (reply(500, "InternalError", "We encountered an internal error"), TargetUnavailable),
        (reply(400, "ThrottlingException", "Rate exceeded"), TargetUnavailable),
        (reply(400, "RequestThrottled", "Request is throttled"), TargetUnavailable),
        (EndpointConnectionError(endpoint_url="http://127.0.0.1:1"), TargetUnavailable),
        (
            reply(
                400,
                "InvalidParameterValue",
                "One or more parameters are invalid. Reason: Message must be shorter than 1048576 bytes.",
            ),
            DeliveryRefused,
        ),
        (reply(400, "InvalidMessageContents", "Invalid characters found"), DeliveryRefused),
        # Neither: counted as a failed attempt, retried with backoff, dead-lettered after max_attempts.
        (reply(400, "AWS.SimpleQueueService.NonExistentQueue", "The specified queue does not exist"), None),
        (reply(403, "AccessDenied", "Access to the resource is denied"), None),
        (RuntimeError("anything else"), None),
    ],
    ids=lambda value: getattr(value, "__name__", None) or str(value)[:40],
)
def test_sqs_replies_are_told_apart(error: BaseException, meaning: type[Exception] | None) -> None:
    assert classify(error) is meaning
    assert sqs_errors.is_outage(error) == (meaning is TargetUnavailable)
    assert sqs_errors.is_refusal(error) == (meaning is DeliveryRefused)


def test_dramatiq_sqs_size_refusals_of_every_version_are_refusals() -> None:
    from delay_broker.dramatiq.delays import sqs_too_large

    # dramatiq-sqs 0.4.1 on: MessageTooLarge; 0.2 to 0.4.0: a bare RuntimeError with this text.
    assert classify(sqs_too_large()("Messages in SQS can be at most 1048576 bytes large.")) is DeliveryRefused
    assert classify(RuntimeError("Messages in SQS can be at most 256KiB large.")) is DeliveryRefused
    assert classify(RuntimeError("Messages in SQS cannot be delayed for longer than 15 minutes.")) is None


def closed(wrapped: BaseException) -> BaseException:
    """What dramatiq's RabbitmqBroker.enqueue raises once its own attempts are spent: the pika error wrapped."""
    from dramatiq.brokers.rabbitmq import ConnectionClosed

    return ConnectionClosed(wrapped)  # type: ignore[no-untyped-call]


def rabbitmq_cases() -> list[tuple[BaseException, type[Exception] | None]]:
    import pika.exceptions as pika  # type: ignore[import-untyped]

    return [
        (closed(pika.AMQPConnectionError("Connection refused")), TargetUnavailable),
        (closed(pika.StreamLostError("Stream connection lost")), TargetUnavailable),
        # The channel's failure is this message's: retried (an attempt counted) or refused, never an outage
        # that releases, and so holds up, everything behind it.
        (closed(pika.NackError([])), None),
        (closed(pika.UnroutableError([])), None),
        (
            closed(
                pika.ChannelClosedByBroker(
                    406, "PRECONDITION_FAILED - message size 100169 is larger than configured max size 65536"
                )
            ),
            DeliveryRefused,
        ),
        (closed(pika.ChannelClosedByBroker(404, "NOT_FOUND - no exchange 'x'")), None),
    ]


def test_rabbitmq_failures_are_told_apart() -> None:
    for error, meaning in rabbitmq_cases():
        assert classify(error) is meaning, (error.args, meaning)
