"""Recurring schedules: a cron expression whose next occurrence is always parked in the delay store.

No beat process and no leader: every promoter that knows a schedule offers its next occurrence to the store,
which parks it only if it is due later than any occurrence ever parked for that schedule (``park.lua``'s
schedule record). So any number of workers may run the same schedules, before, during or after an occurrence
is promoted, and each occurrence runs once. Each occurrence's id is derived from the namespace, the schedule
name and its due time, so every process builds the same message for it.

Occurrences missed while no promoter ran are skipped: after an outage the schedule resumes at its next
occurrence. The core knows nothing of Dramatiq or Celery: an adapter gives each schedule a ``build``
function that turns an occurrence (id, due time) into the envelope of a framework message.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .clock import ms_to_datetime
from .envelope import Envelope
from .errors import ConfigurationError, DelayBrokerError, StoreUnavailable
from .store import DelayStore

logger = logging.getLogger("delay_broker.cron")

RECHECK_MS = 60_000
"""Longest wait between two looks at a schedule: a forgotten record is restored within a minute."""

Build = Callable[[str, datetime], Envelope]
"""Makes the envelope of one occurrence from its message id and due time."""


def _croniter() -> Any:
    try:
        from croniter import croniter
    except ImportError:  # pragma: no cover - depends on the installed extras
        raise ConfigurationError("recurring schedules need croniter: pip install 'delay-broker[cron]'") from None
    return croniter


def _zone(value: str | tzinfo) -> tzinfo:
    if isinstance(value, tzinfo):
        return value
    try:
        return ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError) as error:
        raise ConfigurationError(f"unknown time zone {value!r}") from error


@dataclass(frozen=True)
class Schedule:
    """A message sent at every occurrence of ``cron`` (5 fields, or 6 with seconds last) in ``timezone``.

    ``name`` identifies the schedule across processes and restarts: keep it when changing the expression.
    """

    name: str
    cron: str
    build: Build
    timezone: tzinfo = field(default=timezone.utc)

    @classmethod
    def create(cls, name: str, cron: str, build: Build, timezone: str | tzinfo = "UTC") -> Schedule:
        """A validated schedule; raises :class:`ConfigurationError` for a bad name, expression or zone."""
        if not isinstance(name, str) or not name.strip():
            raise ConfigurationError(f"a schedule needs a non-empty name, got {name!r}")
        if not isinstance(cron, str) or not _croniter().is_valid(cron):
            raise ConfigurationError(f"schedule {name!r}: {cron!r} is not a valid cron expression")
        return cls(name, cron, build, _zone(timezone))

    def next_after(self, ms: int) -> int:
        """Due time (ms) of the first occurrence strictly after ``ms``."""
        start = ms_to_datetime(ms).astimezone(self.timezone)
        following: datetime = _croniter()(self.cron, start).get_next(datetime)
        return int(following.timestamp() * 1000)


def occurrence_id(namespace: str, schedule: str, due_ms: int) -> str:
    """The message id of one occurrence: the same in every process, a UUID as Dramatiq and Celery use."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"delay-broker:{namespace}:{schedule}:{due_ms}"))


class CronScheduler:
    """Keeps the next occurrence of each schedule parked. A promoter calls :meth:`run_pending` when due."""

    def __init__(self, store: DelayStore, schedules: Iterable[Schedule] = ()) -> None:
        self.store = store
        self.schedules: dict[str, Schedule] = {}
        self._next_check = 0.0  # time.monotonic() of the next look; 0: at once
        self._failing: set[str] = set()
        for schedule in schedules:
            self.add(schedule)

    def add(self, schedule: Schedule) -> None:
        if schedule.name in self.schedules:
            raise ConfigurationError(f"there is already a schedule named {schedule.name!r}")
        self.schedules[schedule.name] = schedule
        self._next_check = 0.0

    def seconds_until_due(self) -> float:
        return max(0.0, self._next_check - time.monotonic())

    def run_pending(self) -> int:
        """Offer each schedule's next occurrence to the store if a look is due. Returns how many were parked.

        Raises :class:`StoreUnavailable` when Redis is down (the promoter backs off); a schedule the store
        refuses (a malformed record, a message its build cannot make) is logged and skipped, not fatal.
        """
        if not self.schedules or time.monotonic() < self._next_check:
            return 0
        now_ms = self.store.now_ms()
        parked = 0
        wake_ms = now_ms + RECHECK_MS
        for schedule in self.schedules.values():
            try:
                due_ms = schedule.next_after(now_ms)
                parked += self._offer(schedule, due_ms)
            except StoreUnavailable:
                raise
            except Exception as error:
                self._report(schedule, error)
                continue
            self._failing.discard(schedule.name)
            wake_ms = min(wake_ms, due_ms)
        # Redis-clock milliseconds to local seconds; one more millisecond so the look lands after the due time.
        self._next_check = time.monotonic() + (wake_ms - now_ms + 1) / 1000
        return parked

    def _offer(self, schedule: Schedule, due_ms: int) -> int:
        id = occurrence_id(self.store.keys.namespace, schedule.name, due_ms)
        due = ms_to_datetime(due_ms)
        result = self.store.park_occurrence(schedule.name, id, schedule.build(id, due), due)
        if result.outcome == "kept":
            return 0
        logger.debug("Schedule %r: parked occurrence %s due %s.", schedule.name, id, due.isoformat())
        return 1

    def _report(self, schedule: Schedule, error: Exception) -> None:
        # Once per run of failures: a schedule that keeps failing would otherwise log at every look.
        if schedule.name in self._failing:
            return
        self._failing.add(schedule.name)
        if isinstance(error, DelayBrokerError):
            logger.error("Schedule %r: its next occurrence was not parked: %s", schedule.name, error)
        else:
            logger.exception("Schedule %r: building its next occurrence failed.", schedule.name)
