"""delay_broker: delay Dramatiq and Celery messages for any length of time, parked in Redis.

The core is small: a :class:`DelayStore` keeps parked messages, a :class:`Promoter` hands them back to
their queue when due. The framework adapters live in :mod:`delay_broker.dramatiq` and
:mod:`delay_broker.celery`.
"""

from .envelope import Envelope
from .errors import (
    ConfigurationError,
    CorruptEnvelope,
    DelayBrokerError,
    DeliveryRefused,
    InvalidDelay,
    InvalidMessage,
    NotEnoughReplicas,
    NotReplicated,
    PayloadTooLarge,
    SlotMigrating,
    StoreDamaged,
    StoreError,
    StoreFull,
    StoreLoading,
    StoreReadOnly,
    StoreRefused,
    StoreUnavailable,
    TargetUnavailable,
    WrongNode,
)
from .keys import Keyspace
from .promoter import Deliverer, DirectDeliverer, Promoter
from .schedules import RuntimeSchedules, ScheduleNotFound
from .store import ClaimedMessage, DelayStore, MessageInfo, ParkRequest, ParkResult, StoreStats
from .targets import ListTarget

__version__ = "0.1.0"

__all__ = [
    "ClaimedMessage",
    "ConfigurationError",
    "CorruptEnvelope",
    "DelayBrokerError",
    "DelayStore",
    "Deliverer",
    "DeliveryRefused",
    "DirectDeliverer",
    "Envelope",
    "InvalidDelay",
    "InvalidMessage",
    "Keyspace",
    "ListTarget",
    "MessageInfo",
    "NotEnoughReplicas",
    "NotReplicated",
    "ParkRequest",
    "ParkResult",
    "PayloadTooLarge",
    "Promoter",
    "RuntimeSchedules",
    "ScheduleNotFound",
    "SlotMigrating",
    "StoreDamaged",
    "StoreError",
    "StoreFull",
    "StoreLoading",
    "StoreReadOnly",
    "StoreRefused",
    "StoreStats",
    "StoreUnavailable",
    "TargetUnavailable",
    "WrongNode",
    "__version__",
]
