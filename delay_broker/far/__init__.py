"""The far tier (opt-in): messages due beyond a horizon wait in PostgreSQL, not in Redis.

A store with a tier parks a message due more than ``horizon`` from now (Redis clock) as a row of a PostgreSQL
table, which costs Redis nothing. Every promoter of the store is also a sweeper: every ``sweep_interval`` it
moves the rows that came within the horizon into Redis, where they are promoted as if parked there. Sweepers
need no leader: each locks the rows it moves (``FOR UPDATE SKIP LOCKED``), so they share the work.

A move is atomic from the user's view. The rows stay locked while one ``park.lua`` call adopts them into Redis
and records each row's token (new for each version of a message) in the shard's ``moved`` set, and are deleted
in the same transaction. A mover killed after the adoption leaves its rows behind, unlocked: the next mover
finds their tokens recorded, skips them and deletes them, so a message is never moved in (nor run) twice. A
mover that stalls loses its locks after ``lease`` idle seconds, and Redis refuses its adoption after the same
time, so a row is never moved by two movers at once. Tokens are dropped once their rows are gone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..clock import Delay, delay_to_ms
from ..errors import ConfigurationError
from .rows import FarRow, check_storable

if TYPE_CHECKING:
    from .table import FarTable

__all__ = ["FarRow", "FarTier", "check_storable"]

DEFAULT_HORIZON = 6 * 3600.0


@dataclass(frozen=True)
class FarTier:
    """Where and when far-future messages leave Redis.

    Parameters:
      url: the PostgreSQL database (``postgresql://user:password@host:5432/db`` or a libpq DSN). The table is
        created on first use.
      horizon: seconds (or a timedelta): messages due later than this from now are kept in PostgreSQL until
        they come within it. Keep it well above ``sweep_interval`` and the longest outage of PostgreSQL you
        want to ride out without lateness (default 6 hours).
      sweep_interval: seconds between two sweeps by each promoter.
      batch: rows moved per transaction.
      lease: seconds a mover may hold rows (idle in its transaction) before PostgreSQL releases them and Redis
        refuses its move.
      table: the table's name (one table holds every namespace of the database).
      timeout: seconds a PostgreSQL call may take before its connection is broken and the call fails with
        :class:`~delay_broker.errors.FarTierUnavailable` (a server that stops answering would hold a park, a
        retry or a sweep for ever).
    """

    url: str
    horizon: Delay = DEFAULT_HORIZON
    sweep_interval: float = 5.0
    batch: int = 500
    lease: float = 30.0
    table: str = "delay_broker_far"
    timeout: float = 30.0
    horizon_ms: int = field(init=False)
    lease_ms: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "horizon_ms", delay_to_ms(self.horizon))
        object.__setattr__(self, "lease_ms", delay_to_ms(self.lease))
        if self.horizon_ms <= 0 or not self.sweep_interval > 0 or self.lease_ms < 1000:
            raise ConfigurationError("far tier: horizon and sweep_interval must be positive, lease at least 1 s")
        if not self.timeout > 0:
            raise ConfigurationError(f"far tier: timeout must be positive, got {self.timeout!r}")
        if not 1 <= self.batch <= 1000:
            raise ConfigurationError(f"far tier: batch must be 1..1000, got {self.batch}")
        if self.horizon_ms <= self.sweep_interval * 1000:
            raise ConfigurationError("far tier: horizon must be longer than sweep_interval, or messages arrive late")

    @classmethod
    def with_horizon(cls, url: str, horizon: Delay) -> FarTier:
        """The tier at ``url`` with this horizon, swept every ``sweep_interval`` (5 s) or four times per horizon
        if that is more often: what a URL and a horizon in framework options give."""
        return cls(url, horizon=horizon, sweep_interval=min(cls.sweep_interval, delay_to_ms(horizon) / 4000))

    def table_for(self, namespace: str) -> FarTable:
        # Imported here: psycopg is the optional extra delay_broker[postgres], and the core must not need it.
        try:
            from .table import FarTable
        except ImportError as error:
            raise ConfigurationError(
                f"the far tier needs psycopg: pip install 'delay_broker[postgres]' ({error})"
            ) from None
        return FarTable(self.url, namespace, self.table, call_timeout=self.timeout)
