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


class StoreError(DelayBrokerError):
    """Redis did not do what was asked, for a reason of the server's and not of the message's.

    Promoters back off on these like on an outage, without counting an attempt against any message.
    """


class StoreUnavailable(StoreError, ConnectionError):
    """Redis could not be reached or did not answer; nothing was written (or it is unknown whether it was)."""


class FarTierUnavailable(StoreUnavailable):
    """The far tier's PostgreSQL could not be reached or failed the statement; its transaction was rolled back."""


class StoreRefused(StoreError):
    """Redis answered and refused the operation; nothing was written. Each subclass names one reason."""

    code = ""
    """The Redis error code behind it (``NOREPLICAS``, ``OOM`` ...), when there is one."""


class NotEnoughReplicas(StoreRefused):
    """The master refused writes (``NOREPLICAS``: fewer replicas than ``min-replicas-to-write``)."""

    code = "NOREPLICAS"


class StoreFull(StoreRefused):
    """Redis is at ``maxmemory`` with nothing its policy may evict (``OOM``): nothing more can be parked."""

    code = "OOM"


class StoreReadOnly(StoreRefused):
    """The server is a replica (``READONLY``): a failover is under way, or the URL names a replica."""

    code = "READONLY"


class StoreLoading(StoreRefused):
    """Redis is loading its data set from disk after a restart (``LOADING``)."""

    code = "LOADING"


class WrongNode(StoreRefused):
    """A Redis Cluster answered ``MOVED``/``ASK``/``CROSSSLOT``/``CLUSTERDOWN``/``TRYAGAIN``: the slot lives
    elsewhere, is migrating, or the cluster is not serving it."""

    code = "CLUSTER"


class SlotMigrating(WrongNode):
    """A Redis Cluster slot of the store stayed in migration (``TRYAGAIN``, ``ASK``: a reshard or rebalance moving
    it between masters) for longer than the call waits for it. Redis refused the call before it ran: nothing was
    written, and doing it again is safe."""

    code = "TRYAGAIN"


class StoreDamaged(StoreRefused):
    """The store's own bookkeeping in Redis is damaged (``DAMAGED``: only a hand-made change makes it so, such as a
    pack's count that is not a number): nothing was changed. ``delay-broker check`` shows the damage and
    ``delay-broker check --repair`` mends what can be."""

    code = "DAMAGED"


class NotReplicated(StoreUnavailable):
    """A durable write (``replicas=N``) was made on the master but fewer than N replicas confirmed it in time.

    It is not reported as done: a failover now could lose it. Doing the same call again is safe.
    """


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
