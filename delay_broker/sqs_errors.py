"""What an Amazon SQS error means for a promoter: an outage to wait out, or a message SQS will never take.

Both dramatiq-sqs and kombu's SQS transport send through boto3, so both adapters' deliverers ask here. SQS
reports an outage or throttling as an HTTP reply (a ``ClientError`` with status 5xx or a throttling code),
not only as a refused connection; counting those as failed attempts would dead-letter every message that
came due during the incident.
"""

from __future__ import annotations

from typing import Any

MAX_MESSAGE_BYTES = 1024 * 1024
"""The most SQS takes in one message (body and attributes), as dramatiq-sqs's default ``max_message_size``."""

THROTTLING_CODES = frozenset(
    {
        "InternalError",
        "InternalFailure",
        "RequestLimitExceeded",
        "RequestThrottled",
        "ServiceUnavailable",
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "TooManyRequestsException",
    }
)
"""Error codes AWS gives for a service that is down or sheds load: wait and send again."""

REFUSED_CODES = frozenset({"InvalidMessageContents"})
"""Error codes that no retry will ever get past."""


def _client_error(error: BaseException) -> tuple[str, int] | None:
    """The code and HTTP status of a botocore ``ClientError``, or None for any other error."""
    if not type(error).__module__.startswith("botocore"):
        return None
    from botocore.exceptions import ClientError

    if not isinstance(error, ClientError):
        return None
    response: dict[str, Any] = error.response or {}
    code = str(response.get("Error", {}).get("Code", ""))
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code, status if isinstance(status, int) else 0


def is_outage(error: BaseException) -> bool:
    """True if SQS could not be reached, or answered that it is down or throttling."""
    if type(error).__module__.startswith("botocore"):
        from botocore.exceptions import ConnectionError as BotoConnectionError
        from botocore.exceptions import HTTPClientError

        if isinstance(error, BotoConnectionError | HTTPClientError):
            return True
    found = _client_error(error)
    return found is not None and (found[1] >= 500 or found[0] in THROTTLING_CODES)


def is_refusal(error: BaseException) -> bool:
    """True if SQS refused this message for what it is (too large, characters it does not accept)."""
    found = _client_error(error)
    if found is None:
        return False
    code, _ = found
    return code in REFUSED_CODES or (code == "InvalidParameterValue" and "must be shorter" in str(error))
