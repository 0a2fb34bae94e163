"""What the store takes and gives back: plain records, no Redis in them."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from .clock import Delay
from .envelope import Envelope
from .errors import CorruptEnvelope

OnConflict = Literal["replace", "keep"]
State = Literal["due", "inflight", "dead", "gone"]
NackAction = Literal["retry", "dead", "release"]


@dataclass(frozen=True)
class ParkRequest:
    """One message to park: exactly one of ``delay`` (seconds or timedelta) and ``due`` (aware datetime)."""

    id: str
    envelope: Envelope
    delay: Delay | None = None
    due: datetime | None = None


@dataclass(frozen=True)
class ParkResult:
    id: str
    due_ms: int
    """The due time now stored (for a kept duplicate: the existing one; -1 if it is in flight or dead)."""
    outcome: Literal["new", "replaced", "kept", "stale", "moved"]
    """``stale``: a schedule's occurrence refused because the schedules changed since it was built. ``moved``
    (far tier only): a row already moved into Redis by a mover that died before deleting it."""


@dataclass(frozen=True)
class ClaimedMessage:
    """A message leased to a promoter. ``envelope`` is None when the stored bytes are corrupt."""

    id: str
    due_ms: int
    raw: bytes
    envelope: Envelope | None
    problem: str | None = None


@dataclass(frozen=True)
class Claim:
    now_ms: int
    lease_deadline_ms: int
    next_wake_ms: int | None
    messages: list[ClaimedMessage]
    shard: int = 0
    """The shard the messages were claimed from: give it back to :meth:`DelayStore.ack` / ``nack``."""
    dead_lettered: list[tuple[str, str]] = field(default_factory=list)
    """``(id, reason)`` of the messages the claim itself dead-lettered: a lease that ran out ``max_attempts``
    times, a missing envelope, a spoiled lease record, an id that is not UTF-8."""
    ahead_ms: int = 0
    """How long before their due time the messages were claimed (the promoter's ``ahead``)."""


@dataclass(frozen=True)
class TracedPromotion:
    """A message promoted on the exactly-once path with the trace context it was parked in."""

    id: str
    route: str
    traceparent: str
    tracestate: str


@dataclass(frozen=True)
class DirectPromotion:
    now_ms: int
    next_due_ms: int | None
    promoted: int
    dead_lettered: int
    lateness_ms: list[int]
    shard: int = 0
    by_task: dict[tuple[str, str], int] = field(default_factory=dict)
    """Messages promoted per (route, name): the queue and the actor or task name ('' when the envelope has none)."""
    traced: list[TracedPromotion] = field(default_factory=list)
    """Messages promoted that were parked with an OpenTelemetry context."""


@dataclass(frozen=True)
class MessageInfo:
    """What the store holds for one id."""

    id: str
    state: State
    due_ms: int | None
    at_ms: int | None
    """Lease deadline (in flight) or time it was dead-lettered (dead)."""
    raw: bytes | None
    attempts: int
    error: str | None
    payload_omitted: bool = False
    """True when read by a listing asked for headers only: ``raw`` holds the envelope's header and no payload
    (a corrupt envelope comes whole). Read the message with :meth:`DelayStore.get` for all of it."""

    @property
    def envelope(self) -> Envelope | None:
        if self.raw is None:
            return None
        try:
            return Envelope.decode(self.raw)
        except CorruptEnvelope:
            return None


@dataclass(frozen=True)
class Requeued:
    count: int
    """Dead letters parked again."""
    not_requeued: list[str]
    """Ids given (or found) that were not: not dead-lettered, or with no payload to requeue."""


@dataclass(frozen=True)
class StoreStats:
    now_ms: int
    parked: int
    inflight: int
    dead: int
    overdue: int
    next_due_ms: int | None
    live_promoters: int
    counters: dict[str, int]
    histogram: list[int]
    """Parked messages per bucket of :attr:`DelayStore.HISTOGRAM_EDGES`, plus one for later."""
    shards: int = 1
    """Shards the counts were summed over."""
    far: int = 0
    """Of :attr:`parked`, the messages waiting in the far tier (PostgreSQL); 0 without one."""
    packed: int = 0
    """Of :attr:`parked`, the messages kept in packs (see :mod:`delay_broker.packing`)."""

    @property
    def oldest_overdue_age_ms(self) -> int:
        if self.overdue == 0 or self.next_due_ms is None:
            return 0
        return max(0, self.now_ms - self.next_due_ms)


@dataclass(frozen=True)
class StoredSchedules:
    """The runtime schedules' definitions as stored (JSON bytes by name), at one revision."""

    revision: int
    definitions: dict[str, bytes]
    records: dict[str, int | None]
    """Every schedule's record: the due time (ms) of its latest occurrence parked (None when malformed)."""


@dataclass(frozen=True)
class ScheduleUpdate:
    done: bool
    """False when the revision or the record changed since they were read: nothing was changed."""
    revision: int
    now_ms: int
    cancelled: bool
    """Whether the schedule's parked occurrence was cancelled."""


Position = tuple[str, str]
"""Where a scan of one index stands: the sort key of the last entry it examined (a shard's score and id, or a far
row's due time and token), as text. A scan goes on after it, wherever that entry is now."""


@dataclass(frozen=True)
class IndexScan:
    """One bounded scan of a shard's index (see :meth:`DelayStore.scan_index`)."""

    examined: int
    exhausted: bool
    """Nothing is left in the window after the last entry examined."""
    matches: list[tuple[Position, MessageInfo]]
    """Each match with its position in the index."""
    last: Position | None
    """The position of the last entry examined (where the next scan goes on), None if none was."""


@dataclass(frozen=True)
class FarSnapshot:
    """A read of the far tier as of one moment (:meth:`DelayStore.far_snapshot`), leaving out the rows whose
    messages were moved into Redis by then."""

    view: Any
    """The connection of a repeatable-read transaction."""
    leaving: tuple[int, ...]
    """Tokens of rows moved into Redis whose delete may not be committed yet."""
