"""A park resolved once, at the store's door: its due time (:class:`Due`) and its envelope as stored, together a
:class:`Parcel` that every park path (the one-message scripts, their fallback, batches, the far tier) shares."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from datetime import datetime
from typing import NamedTuple

from .. import tracing
from ..clock import Delay, delay_to_ms, due_to_ms
from ..envelope import Envelope
from ..errors import InvalidDelay, InvalidMessage, PayloadTooLarge
from ..records import ParkRequest
from .replies import check_id


class Due(NamedTuple):
    """A due time as the scripts take it: ``ms`` after the Redis clock's now when parked, or (``absolute``) epoch
    milliseconds. (Tuples: one is made for every park, and a frozen dataclass costs a microsecond more.)"""

    ms: int
    absolute: bool = False

    @classmethod
    def of(cls, delay: Delay | None, due: datetime | None, id: str) -> Due:
        """Exactly one of ``delay`` (seconds or a timedelta) and ``due`` (an aware datetime), checked."""
        if (delay is None) == (due is None):
            raise InvalidDelay(f"give exactly one of delay and due for {id!r}")
        if delay is not None:
            return cls(delay_to_ms(delay))
        return cls(due_to_ms(due), absolute=True)  # type: ignore[arg-type]

    def at(self, now_ms: int) -> int:
        """The due time in epoch ms, for a park made at ``now_ms``."""
        return self.ms if self.absolute else now_ms + self.ms

    @property
    def wire(self) -> str:
        """The one form every park script reads: ``123`` for a delay, ``@123`` for an absolute due time."""
        return f"@{self.ms}" if self.absolute else str(self.ms)


class Parcel(NamedTuple):
    """One message to park: its id, its due time and its envelope as the store keeps it."""

    id: str
    due: Due
    record: bytes
    envelope: Envelope | None = None
    """The envelope the record was made from (the far tier keeps its route and name in columns of their own);
    None for a record read back (a far row moved into Redis)."""


class Encoder:
    """Envelopes as this store writes them: the payload checked, the trace context added, in its record version."""

    def __init__(self, max_payload_bytes: int, record_version: int) -> None:
        self.max_payload_bytes = max_payload_bytes
        self.record_version = record_version

    def parcel(self, request: ParkRequest, carrier: Mapping[str, str] | None = None) -> Parcel:
        """``request`` checked and encoded, with the trace context ``carrier`` (of
        :func:`~delay_broker.tracing.current_carrier`, read once for a batch)."""
        return self.parcel_of(request.id, request.envelope, request.delay, request.due, carrier)

    def parcel_of(
        self, id: str, envelope: Envelope, delay: Delay | None, due: datetime | None, carrier: Mapping[str, str] | None
    ) -> Parcel:
        """A park checked and encoded (``carrier``: the trace context to store with it, or None)."""
        check_id(id)
        due_time = Due.of(delay, due, id)
        if carrier is not None:
            envelope = dataclasses.replace(envelope, extra=tracing.with_carrier(envelope.extra, carrier))
        return Parcel(id, due_time, self.envelope(id, envelope), envelope)

    def envelope(self, id: str, envelope: Envelope, *, keep_context: bool = False, traced: bool = False) -> bytes:
        """``envelope`` as stored; ``traced``: with the current trace context added (``keep_context``: unless it
        carries one already: a message rewritten after it was parked keeps its producer's trace)."""
        if not isinstance(envelope.payload, bytes):
            raise InvalidMessage(f"payload must be bytes, got {type(envelope.payload).__name__}")
        if len(envelope.payload) > self.max_payload_bytes:
            raise PayloadTooLarge(
                f"payload of {id!r} is {len(envelope.payload)} bytes, over the limit of {self.max_payload_bytes}"
            )
        if traced:
            extra = tracing.with_context(envelope.extra, keep=keep_context)
            if extra != envelope.extra:
                envelope = dataclasses.replace(envelope, extra=extra)
        version = min(self.record_version, envelope.version) if envelope.version else self.record_version
        return envelope.encode(int(time.time() * 1000), version)
