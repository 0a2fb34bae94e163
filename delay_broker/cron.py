"""Recurring schedules: the next occurrence of each schedule is always parked in the delay store.

No beat process and no leader: every promoter that knows a schedule offers its next occurrence to the store,
which parks it only if it is due later than any occurrence ever parked for that schedule (``park.lua``'s
schedule record). So any number of workers may run the same schedules, before, during or after an occurrence
is promoted, and each occurrence runs once. Each occurrence's id is derived from the namespace, the schedule
name and its due time, so every process builds the same message for it.

Schedules come from two places: declared in code (:class:`Schedule`, given to the scheduler by an adapter),
and stored at runtime (:mod:`delay_broker.schedules`: added, changed, paused, resumed, run now or removed
without a deploy). A stored definition of a declared name overrides what it sets (its timing, a pause). The
scheduler re-reads the stored definitions when their revision moves; an occurrence built from definitions
that changed meanwhile is refused by the store (``stale``) and built again.

Occurrences missed because the promoters fell behind or were all down (a long delivery, a broker outage, a
restart) are parked late, one after the other, for up to :data:`CATCH_UP_MS`; older ones are skipped (logged
and counted as missed) and the schedule resumes at its next occurrence. The core knows nothing of Dramatiq or
Celery: an adapter gives each schedule a ``build`` function that turns an occurrence (id, due time) into the
envelope of a framework message, and a ``builder`` that makes one for a stored call.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo

from .clock import ms_to_datetime
from .envelope import Envelope
from .errors import ConfigurationError, DelayBrokerError, StoreUnavailable
from .schedule_defs import (
    ScheduledCall,
    ScheduleDefinition,
    check_name,
    occurrence_id,
    run_now_record,
)
from .store import DelayStore
from .timing import COUNT_LIMIT, Timing

__all__ = ["CATCH_UP_MS", "Build", "CronScheduler", "Schedule", "occurrence_id"]

logger = logging.getLogger("delay_broker.cron")

RECHECK_MS = 60_000
"""Longest wait between two looks at a schedule: a forgotten record is restored within a minute."""
CATCH_UP_MS = 60_000
"""How late an occurrence may still be parked (and run) when the promoters fell behind; older ones are skipped."""
RETRY_MS = 5_000
"""Wait before trying again a schedule the store refused (a failover, a malformed record)."""
REPORT_EVERY = 600.0
"""Seconds between two log lines about a schedule that keeps failing."""
REVISION_CHECK_S = 0.5
"""Shortest time between two reads of the stored schedules' revision by one scheduler."""

Build = Callable[[str, datetime], Envelope]
"""Makes the envelope of one occurrence from its message id and due time."""
Builder = Callable[[ScheduledCall], Build]
"""An adapter's: makes the ``build`` of a stored schedule's call."""
MissedListener = Callable[[str, int], None]
"""Told the schedule name and how many occurrences were skipped, once per gap (by the promoter that resumed it)."""


@dataclass(frozen=True)
class Schedule:
    """A message sent at every occurrence of ``timing``. ``name`` identifies the schedule across processes and
    restarts: keep it when changing the timing."""

    name: str
    timing: Timing
    build: Build

    @classmethod
    def create(
        cls,
        name: str,
        cron: str | None,
        build: Build,
        timezone: str | tzinfo = "UTC",
        *,
        every: float | timedelta | None = None,
        start: datetime | None = None,
        end: datetime | None = None,
    ) -> Schedule:
        """A validated schedule: ``cron`` (5 fields, or 6 with seconds last) in ``timezone``, or ``every``
        (seconds or a timedelta), optionally not before ``start`` nor after ``end``. Raises
        :class:`ConfigurationError` for a bad name, expression, interval, zone or dates."""
        try:
            timing = Timing.create(cron=cron, every=every, timezone=timezone, start=start, end=end)
        except ConfigurationError as error:
            raise ConfigurationError(f"schedule {name!r}: {error}") from None
        return cls(check_name(name), timing, build)

    def next_after(self, ms: int) -> int | None:
        """Due time (ms) of the first occurrence strictly after ``ms``; None once the schedule has ended."""
        return self.timing.next_after(ms)


@dataclass(frozen=True)
class _Active:
    """A schedule as this scheduler runs it: the code's declaration with the stored definition applied."""

    name: str
    timing: Timing | None
    build: Build | None
    paused: bool
    runs: tuple[int, ...]


class CronScheduler:
    """Keeps the next occurrence of each schedule parked. A promoter calls :meth:`run_pending` every cycle.

    ``builder`` (from an adapter) turns stored calls into messages; without one, stored schedules that need
    it are skipped. ``on_missed`` is told of occurrences skipped because no promoter ran them in time.
    """

    def __init__(
        self,
        store: DelayStore,
        schedules: Iterable[Schedule] = (),
        *,
        builder: Builder | None = None,
        on_missed: MissedListener | None = None,
    ) -> None:
        self.store = store
        self.builder = builder
        self.on_missed = on_missed
        self.declared: dict[str, Schedule] = {}
        self._active: dict[str, _Active] = {}
        self._revision: int | None = None  # of the stored definitions in _active; None: never read
        self._revision_checked = float("-inf")
        self._read_skipped = False
        self._next_check = 0.0  # time.monotonic() of the next look; 0: at once
        self._latest: dict[str, int] = {}  # per record: the latest occurrence parked, as the store last said
        self._failing: dict[str, float] = {}  # per failing schedule: when it was last reported
        self._warned: dict[str, object] = {}  # per schedule: what it was last warned about (once each)
        for schedule in schedules:
            self.add(schedule)

    def add(self, schedule: Schedule) -> None:
        if schedule.name in self.declared:
            raise ConfigurationError(f"there is already a schedule named {schedule.name!r}")
        self.declared[schedule.name] = schedule
        self._revision = None  # merge it with the stored definitions at the next look
        self._next_check = 0.0

    @property
    def schedules(self) -> dict[str, Schedule]:
        """The schedules declared in code, by name (stored ones are in :mod:`delay_broker.schedules`)."""
        return dict(self.declared)

    def seconds_until_due(self) -> float:
        """Until the next look, or until the revision may be read again when a wake-up came too soon after the
        last read to read it (the change that woke the promoter is seen then, not after max_idle)."""
        until = self._next_check
        if self._read_skipped:
            until = min(until, self._revision_checked + REVISION_CHECK_S)
        return max(0.0, until - time.monotonic())

    def run_pending(self) -> int:
        """Offer each schedule's next occurrence to the store if a look is due. Returns how many were parked.

        Raises :class:`StoreUnavailable` when Redis is down (the promoter backs off); a schedule the store
        refuses (a malformed record, a message its build cannot make) is logged and tried again later; it
        never holds up the other schedules or the promotion of other messages.
        """
        if self._changed():
            self._next_check = 0.0
        if time.monotonic() < self._next_check:
            return 0
        for _ in range(3):
            if self._revision is None:
                self._load()
            parked, stale = self._look()
            if not stale:
                return parked
            self._revision = None  # the schedules changed while this look built an occurrence: read them again
        return parked

    # -- stored definitions ----------------------------------------------------------------------------

    def _changed(self) -> bool:
        """Whether the stored definitions moved on (read at most every REVISION_CHECK_S)."""
        if self._revision is None:
            return True
        now = time.monotonic()
        if now - self._revision_checked < REVISION_CHECK_S:
            self._read_skipped = True
            return False
        self._revision_checked = now
        self._read_skipped = False
        try:
            revision = self.store.schedules_revision()
        except StoreUnavailable:
            raise
        except DelayBrokerError:
            return False  # a spoiled revision key: the look's offers report it
        if revision == self._revision:
            return False
        self._revision = None
        return True

    def _load(self) -> None:
        """Read the stored definitions and records, and merge them with the declared schedules."""
        try:
            stored = self.store.stored_schedules()
        except StoreUnavailable:
            raise
        except DelayBrokerError as error:
            # A spoiled key: run what the code declares; each offer reports the problem it meets.
            self._report("(stored schedules)", error)
            self._active = {name: _Active(name, s.timing, s.build, False, ()) for name, s in self.declared.items()}
            try:
                # Read again only when something changes: not at every cycle while the key stays spoiled.
                self._revision = self.store.schedules_revision()
            except StoreUnavailable:
                raise
            except DelayBrokerError:
                self._revision = -1
            self._revision_checked = time.monotonic()
            return
        definitions: dict[str, ScheduleDefinition] = {}
        for name, raw in stored.definitions.items():
            try:
                definitions[name] = ScheduleDefinition.decode(name, raw)
            except Exception as error:
                # One unreadable definition is that schedule's problem only: the others, and the promotion of
                # every other message, go on.
                self._report(name, error)
        active = {}
        for name in {*self.declared, *definitions}:
            declared, definition = self.declared.get(name), definitions.get(name)
            timing = declared.timing if declared else None
            build = declared.build if declared else None
            paused, runs = False, tuple[int, ...]()
            if definition is not None:
                timing = definition.timing or timing
                paused, runs = definition.paused, definition.runs
                if definition.call is not None and self.builder is not None:
                    if declared is not None:
                        self._warn_once(
                            name,
                            "both",
                            "Schedule %r is declared in code and stored with a call of its own: the stored one runs.",
                        )
                    try:
                        build = self.builder(definition.call)
                    except Exception as error:
                        self._report(name, error)  # an adapter's builder refusing a call skips that schedule only
                        continue
            active[name] = _Active(name, timing, build, paused, runs)
        self._active = active
        self._latest = {name: due for name, due in stored.records.items() if due is not None}
        self._revision = stored.revision
        self._revision_checked = time.monotonic()

    # -- one look --------------------------------------------------------------------------------------

    def _look(self) -> tuple[int, bool]:
        """Offer what is due of every active schedule. Returns how many were parked, and whether an offer was
        refused as stale."""
        now_ms = self.store.now_ms()
        parked = 0
        wake_ms = now_ms + RECHECK_MS
        for schedule in self._active.values():
            if schedule.build is None:
                # Stored for code this process does not declare (another application of the namespace).
                logger.debug(
                    "Schedule %r: not declared in this process; left to the promoters that declare it.", schedule.name
                )
                continue
            try:
                parked_now, wake = self._offer_runs(schedule, now_ms)
                parked += parked_now
                if not schedule.paused and schedule.timing is not None:
                    count, next_wake = self._offer_next(schedule, schedule.timing, schedule.build, now_ms)
                    parked += count
                    wake = min(wake, next_wake)
            except StoreUnavailable:
                raise
            except _Stale:
                return parked, True
            except Exception as error:
                self._report(schedule.name, error)
                wake_ms = min(wake_ms, now_ms + RETRY_MS)
                continue
            self._failing.pop(schedule.name, None)
            wake_ms = min(wake_ms, wake)
        # Redis-clock milliseconds to local seconds; one more millisecond so the look lands after the due time.
        self._next_check = time.monotonic() + (wake_ms - now_ms + 1) / 1000
        return parked, False

    def _offer_next(self, schedule: _Active, timing: Timing, build: Build, now_ms: int) -> tuple[int, int]:
        """Offer the schedule's next occurrence; returns how many were parked and when to look again (ms)."""
        upcoming = timing.next_after(now_ms)
        latest = self._latest.get(schedule.name)
        due = upcoming
        if latest is not None and latest < now_ms:
            # The occurrence after the latest one, even if it is already past (the promoters fell behind):
            # late is better than never, within CATCH_UP_MS. Older ones are skipped: the first still within it
            # is next, not the one after now.
            following = timing.next_after(latest)
            if following is not None and following < now_ms - CATCH_UP_MS:
                following = timing.next_after(now_ms - CATCH_UP_MS - 1)
            if following is not None:
                due = following
        if due is None:
            if latest is None or latest <= now_ms:
                self._warn_once(
                    schedule.name,
                    "ended",
                    "Schedule %r has ended (its end date is past): nothing more is parked.",
                    logging.INFO,
                )
            return 0, now_ms + RECHECK_MS
        parked = self._offer(schedule.name, schedule.name, build, due, upcoming)
        if parked and latest is not None and latest < now_ms:
            missed = timing.count_between(latest, due)
            if missed:
                capped = timing.cron is not None and missed == COUNT_LIMIT
                self._missed(schedule.name, missed, latest, due, capped=capped)
        # Look again once the latest occurrence is due: then the one after it is to be parked.
        return parked, max(self._latest[schedule.name], now_ms)

    def _offer_runs(self, schedule: _Active, now_ms: int) -> tuple[int, int]:
        """Park each run-now request not parked yet (once each, whoever offers it)."""
        assert schedule.build is not None
        record, parked = run_now_record(schedule.name), 0
        for requested in sorted(schedule.runs):
            if requested > self._latest.get(record, -1):
                parked += self._offer(record, schedule.name, schedule.build, requested, None)
        return parked, now_ms + RECHECK_MS

    def _offer(self, record: str, name: str, build: Build, due_ms: int, upcoming: int | None) -> int:
        id = occurrence_id(self.store.keys.namespace, record, due_ms)
        due = ms_to_datetime(due_ms)
        result = self.store.park_occurrence(record, id, build(id, due), due, revision=self._revision_guard())
        if result.outcome == "stale":
            raise _Stale
        if result.outcome != "kept":
            self._latest[record] = due_ms
            logger.debug("Schedule %r: parked occurrence %s due %s.", name, id, due.isoformat())
            return 1
        self._latest[record] = result.due_ms
        if upcoming is not None and result.due_ms > upcoming:
            # Nobody parks past the next occurrence after now: that record was made by another expression (a
            # schedule changed in code, or another application using the same name).
            self._warn_once(
                name,
                result.due_ms,
                "Schedule %r: an occurrence due %s is already parked, later than this schedule's next (%s); it "
                "resumes after that one. If the expression changed, 'delay-broker cron forget %s' restarts it.",
                logging.WARNING,
                ms_to_datetime(result.due_ms).isoformat(),
                ms_to_datetime(upcoming).isoformat(),
                name,
            )
        return 0

    def _revision_guard(self) -> int | None:
        return None if self._revision is None or self._revision < 0 else self._revision

    # -- reporting -------------------------------------------------------------------------------------

    def _missed(self, name: str, count: int, latest: int, resumed: int, *, capped: bool = False) -> None:
        logger.warning(
            "Schedule %r: %s occurrence(s) after %s were missed (no promoter ran them within %d s of their time); "
            "it resumes at %s.",
            name,
            f"at least {count}" if capped else f"{count}",
            ms_to_datetime(latest).isoformat(),
            CATCH_UP_MS // 1000,
            ms_to_datetime(resumed).isoformat(),
        )
        if self.on_missed is not None:
            self.on_missed(name, count)

    def _warn_once(self, name: str, about: object, message: str, level: int = logging.WARNING, *args: object) -> None:
        if self._warned.get(name) == about:
            return
        self._warned[name] = about
        logger.log(level, message, name, *args)

    def _report(self, name: str, error: Exception) -> None:
        # Once per REPORT_EVERY: a schedule that keeps failing would otherwise log at every retry.
        last = self._failing.get(name)
        if last is not None and time.monotonic() - last < REPORT_EVERY:
            return
        self._failing[name] = time.monotonic()
        if isinstance(error, DelayBrokerError):
            logger.error("Schedule %r: its next occurrence was not parked: %s", name, error)
        else:
            logger.error("Schedule %r: building its next occurrence failed.", name, exc_info=error)


class _Stale(Exception):
    """The store refused an occurrence: the stored schedules changed since this scheduler read them."""
