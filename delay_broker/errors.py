"""Exceptions raised by delay_broker."""

from __future__ import annotations


class DelayBrokerError(Exception):
    """Base class of every error delay_broker raises on purpose."""


class InvalidDelay(DelayBrokerError, ValueError):
    """A delay or due time that cannot be honoured (NaN, infinite, negative, naive, too far, not a number)."""


class InvalidMessage(DelayBrokerError, ValueError):
    """A message id or payload the store refuses (empty or non-string id, payload not bytes)."""


class PayloadTooLarge(InvalidMessage):
    """A payload larger than the store's ``max_payload_bytes``."""


class StoreUnavailable(DelayBrokerError, ConnectionError):
    """Redis could not be reached or did not answer; nothing was written (or it is unknown whether it was)."""


class CorruptEnvelope(DelayBrokerError, ValueError):
    """Stored bytes that are not an envelope this version understands."""


class DeliveryRefused(DelayBrokerError):
    """Raised by a deliverer for a message that can never be delivered; it is dead-lettered at once.

    Any other exception from a deliverer is taken as temporary: the message is retried with backoff.
    """


class TargetUnavailable(DelayBrokerError, ConnectionError):
    """Raised by a deliverer when the target broker cannot be reached.

    The promoter gives the message (and the rest of its batch) back without counting an attempt, then backs
    off: a broker outage must not use up the messages' attempts and send them to the dead letters.
    """


class ConfigurationError(DelayBrokerError, ValueError):
    """Options that make no sense, reported when they are given rather than when a message is sent."""
