"""Recurring schedules: a cron expression whose next occurrence is always parked in the delay store.

No beat process and no leader: every promoter that knows a schedule offers its next occurrence to the store,
which parks it only if it is due later than any occurrence ever parked for that schedule (``park.lua``'s
schedule record). So any number of workers may run the same schedules, before, during or after an occurrence
is promoted, and each occurrence runs once. Each occurrence's id is derived from the namespace, the schedule
name and its due time, so every process builds the same message for it.

Occurrences missed because the promoters fell behind or were all down (a long delivery, a broker outage, a
restart) are parked late, one after the other, for up to :data:`CATCH_UP_MS`; older ones are skipped and the
schedule resumes at its next occurrence. The core knows nothing of Dramatiq or Celery: an adapter gives each
schedule a ``build`` function that turns an occurrence (id, due time) into the envelope of a framework message.
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
CATCH_UP_MS = 60_000
"""How late an occurrence may still be parked (and run) when the promoters fell behind; older ones are skipped."""
RETRY_MS = 5_000
"""Wait before trying again a schedule the store refused (a failover, a malformed record)."""
REPORT_EVERY = 600.0
"""Seconds between two log lines about a schedule that keeps failing."""

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
    if not isinstance(value, str):
        raise ConfigurationError(f"timezone must be an IANA name or a tzinfo, got {value!r}")
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
        schedule = cls(name, cron, build, _zone(timezone))
        try:
            # Valid syntax can still never fire ("0 0 31 2 *"): find out now, not at every look.
            schedule.next_after(int(time.time() * 1000))
        except Exception as error:
            raise ConfigurationError(f"schedule {name!r}: {cron!r} has no next occurrence ({error})") from None
        return schedule

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
        self._latest: dict[str, int] = {}  # per schedule: the latest occurrence parked, as the store last said
        self._failing: dict[str, float] = {}  # per failing schedule: when it was last reported
        self._warned: dict[str, int] = {}
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
        refuses (a malformed record, a message its build cannot make) is logged and tried again later; it
        never holds up the other schedules or the promotion of other messages.
        """
        if not self.schedules or time.monotonic() < self._next_check:
            return 0
        now_ms = self.store.now_ms()
        if any(name not in self._latest for name in self.schedules):
            # First look: start from the store's records, so a promoter that just started also catches up
            # on an occurrence missed during a restart (records of None are malformed; the offer reports it).
            try:
                known = self.store.schedules()
            except StoreUnavailable:
                raise
            except DelayBrokerError:
                known = {}  # a spoiled cron key: each offer below fails on it too, and reports it
            self._latest.update({name: due for name, due in known.items() if name in self.schedules and due})
        parked = 0
        wake_ms = now_ms + RECHECK_MS
        for schedule in self.schedules.values():
            try:
                upcoming = schedule.next_after(now_ms)
                parked += self._offer(schedule, self._next_due(schedule, now_ms, upcoming), upcoming)
            except StoreUnavailable:
                raise
            except Exception as error:
                self._report(schedule, error)
                wake_ms = min(wake_ms, now_ms + RETRY_MS)
                continue
            self._failing.pop(schedule.name, None)
            # Look again once the latest occurrence is due: then the one after it is to be parked.
            wake_ms = min(wake_ms, max(self._latest[schedule.name], now_ms))
        # Redis-clock milliseconds to local seconds; one more millisecond so the look lands after the due time.
        self._next_check = time.monotonic() + (wake_ms - now_ms + 1) / 1000
        return parked

    def _next_due(self, schedule: Schedule, now_ms: int, upcoming: int) -> int:
        """The occurrence to offer; ``upcoming`` is the first one after now."""
        latest = self._latest.get(schedule.name)
        if latest is not None and latest < now_ms:
            # The occurrence after the latest one, even if it is already past (this promoter fell behind):
            # late is better than never, within CATCH_UP_MS.
            following = schedule.next_after(latest)
            if following >= now_ms - CATCH_UP_MS:
                return following
        return upcoming

    def _offer(self, schedule: Schedule, due_ms: int, upcoming: int) -> int:
        id = occurrence_id(self.store.keys.namespace, schedule.name, due_ms)
        due = ms_to_datetime(due_ms)
        result = self.store.park_occurrence(schedule.name, id, schedule.build(id, due), due)
        if result.outcome != "kept":
            self._latest[schedule.name] = due_ms
            logger.debug("Schedule %r: parked occurrence %s due %s.", schedule.name, id, due.isoformat())
            return 1
        self._latest[schedule.name] = result.due_ms
        if result.due_ms > upcoming and self._warned.get(schedule.name) != result.due_ms:
            # Nobody parks past the next occurrence after now: that record was made by another expression (a
            # changed schedule, or another application using the same name).
            self._warned[schedule.name] = result.due_ms
            logger.warning(
                "Schedule %r: an occurrence due %s is already parked, later than this schedule's next (%s); it "
                "resumes after that one. If the expression changed, 'delay-broker cron forget %s' restarts it.",
                schedule.name,
                ms_to_datetime(result.due_ms).isoformat(),
                ms_to_datetime(upcoming).isoformat(),
                schedule.name,
            )
        return 0

    def _report(self, schedule: Schedule, error: Exception) -> None:
        # Once per REPORT_EVERY: a schedule that keeps failing would otherwise log at every retry.
        last = self._failing.get(schedule.name)
        if last is not None and time.monotonic() - last < REPORT_EVERY:
            return
        self._failing[schedule.name] = time.monotonic()
        if isinstance(error, DelayBrokerError):
            logger.error("Schedule %r: its next occurrence was not parked: %s", schedule.name, error)
        else:
            logger.error("Schedule %r: building its next occurrence failed.", schedule.name, exc_info=error)
