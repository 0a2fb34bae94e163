"""What a store is configured with: :class:`StoreOptions`, checked once when the store is made."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property

from ..clock import Delay, delay_to_ms
from ..envelope import VERSION as ENVELOPE_VERSION
from ..errors import ConfigurationError, InvalidDelay
from ..far import FarTier
from ..keys import DEFAULT_NAMESPACE, DEFAULT_PREFIX, MAX_SHARDS
from ..packing import DEFAULT_PACK_AFTER_MS, PackPolicy

DEFAULT_MAX_PAYLOAD = 1024 * 1024


@dataclass(frozen=True)
class StoreOptions:
    """The options of a :class:`~delay_broker.store.DelayStore`, checked when it is made.

    Parameters:
      namespace: separates independent stores in one Redis; every key carries it in its hash tag.
      prefix: the first part of every key's name (default ``delay_broker``).
      max_payload_bytes: larger payloads are refused at park time.
      max_attempts: promotion attempts (failed deliveries or lost leases) before a message is dead-lettered.
      retry_backoff: first and largest wait, in seconds, before a failed delivery is tried again.
      shards: how many shards (hash tags, so Redis Cluster slots) the namespace spreads over. ``None`` takes
        what the namespace was created with (1 if never said). A number is recorded in the namespace the
        first time and checked against it after: every process of an application sees the same shards.
      replicas: durable writes. With N > 0, every write (park, reschedule, cancel, ack, nack, promotion)
        waits until N replicas confirm it (Redis ``WAIT``) and raises :class:`~.errors.NotReplicated`
        otherwise, so a write reported done survives a failover. Promotions also need N in-sync replicas
        before they start.
      replica_timeout: seconds to wait for that confirmation.
      max_delay: seconds (or a timedelta): a park or reschedule due further than this from now (by the Redis
        clock) is refused with :class:`~.errors.InvalidDelay` naming the limit. ``None`` (default): no limit
        but the year 2248. Recurring schedules' occurrences are exempt (their period sets their delay).
      dead_max_count: keep at most this many dead letters per shard; the oldest are dropped. ``None``: no bound.
      dead_max_age: seconds (or a timedelta): drop dead letters dead for longer. ``None``: no bound.
        Both bounds are enforced by :meth:`DelayStore.trim_dead`, which promoters call (see there); dropped
        letters are counted in the ``dead_dropped`` counter of :meth:`DelayStore.stats`.
      record_version: the envelope format written (see :mod:`delay_broker.envelope`): 2, the compact binary
        header (default), or 1, the JSON header of releases before it, for a rolling upgrade while older
        promoters still run. Both are always read.
      far_tier: a :class:`~delay_broker.far.FarTier` (or its PostgreSQL URL) to keep messages due beyond its
        horizon out of Redis until they come within it (see :mod:`delay_broker.far`). ``None`` (default):
        every message is parked in Redis.
      far_horizon: the horizon when ``far_tier`` is given as a URL (default 6 hours); sweeps then run every 5 s,
        or four times per horizon if that is shorter.
      pack_after: seconds (or a timedelta): a message due at least this far ahead is packed, at about half the
        memory (see :mod:`delay_broker.packing`), and moved into the ordinary layout by promoters when it comes
        within half of it. Default 5 minutes; ``None`` packs nothing (for a rolling upgrade from a release
        without packs: its promoters would not open them). Packed messages are read, cancelled and rescheduled
        by every store whatever its own setting.
    """

    namespace: str = DEFAULT_NAMESPACE
    prefix: str = DEFAULT_PREFIX
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD
    max_attempts: int = 5
    retry_backoff: tuple[float, float] = (1.0, 300.0)
    shards: int | None = None
    replicas: int = 0
    replica_timeout: float = 1.0
    max_delay: Delay | None = None
    dead_max_count: int | None = None
    dead_max_age: Delay | None = None
    record_version: int = ENVELOPE_VERSION
    far_tier: FarTier | str | None = None
    far_horizon: Delay | None = None
    pack_after: Delay | None = DEFAULT_PACK_AFTER_MS / 1000

    def __post_init__(self) -> None:
        if self.max_payload_bytes <= 0 or self.max_attempts < 1:
            raise ValueError("max_payload_bytes and max_attempts must be positive")
        shards = self.shards
        if shards is not None and (isinstance(shards, bool) or not isinstance(shards, int)):
            raise ConfigurationError(f"shards must be a whole number, got {shards!r}")
        if shards is not None and not 1 <= shards <= MAX_SHARDS:
            raise ConfigurationError(f"shards must be 1..{MAX_SHARDS}, got {shards}")
        replicas = self.replicas
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
            raise ConfigurationError(f"replicas must be a whole number >= 0, got {replicas!r}")
        if not self.replica_timeout > 0:
            raise ConfigurationError(f"replica_timeout must be positive, got {self.replica_timeout!r}")
        count = self.dead_max_count
        if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
            raise ConfigurationError(f"dead_max_count must be a whole number >= 0 or None, got {count!r}")
        if self.record_version not in (1, 2):
            raise ConfigurationError(f"record_version must be 1 or 2, got {self.record_version!r}")
        # Each derived value once now: a bad one is refused when the store is made, not at its first use.
        for name in ("pack", "max_delay_ms", "dead_max_age_ms", "retry_backoff_ms", "replica_timeout_ms"):
            getattr(self, name)

    @cached_property
    def pack(self) -> PackPolicy:
        return PackPolicy.of(self.pack_after)

    @cached_property
    def max_delay_ms(self) -> int | None:
        return positive_ms("max_delay", self.max_delay)

    @cached_property
    def dead_max_age_ms(self) -> int | None:
        return positive_ms("dead_max_age", self.dead_max_age)

    @cached_property
    def retry_backoff_ms(self) -> tuple[int, int]:
        return delay_to_ms(self.retry_backoff[0]), delay_to_ms(self.retry_backoff[1])

    @cached_property
    def replica_timeout_ms(self) -> int:
        return delay_to_ms(self.replica_timeout)

    @property
    def max_delay_arg(self) -> int:
        """``max_delay`` as the scripts take it: milliseconds, or -1 for none."""
        return -1 if self.max_delay_ms is None else self.max_delay_ms


STORE_OPTIONS = tuple(field.name for field in dataclasses.fields(StoreOptions))
"""Options of :class:`DelayStore` itself; :meth:`DelayStore.from_url` gives every other one to the client."""


def positive_ms(name: str, value: Delay | None) -> int | None:
    """A duration option (seconds or a timedelta) in milliseconds, > 0; None stays None."""
    if value is None:
        return None
    try:
        millis = delay_to_ms(value)
    except InvalidDelay as error:
        raise ConfigurationError(f"{name}: {error} (give seconds or a timedelta)") from None
    if millis <= 0:
        raise ConfigurationError(f"{name} must be positive, got {value!r}")
    return millis
