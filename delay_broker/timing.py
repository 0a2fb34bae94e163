"""When a recurring schedule fires: a cron expression or a fixed interval, optionally between two dates.

Occurrences are computed, never stored: every process derives the same due times from the same timing, which
is what lets any number of promoters share a schedule without a leader. An interval counts from ``start``
when one is given, else from the Unix epoch, so ``every=3600`` fires on the hour in every process.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Any, ClassVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .clock import delay_to_ms, due_to_ms, ms_to_datetime
from .errors import ConfigurationError, InvalidDelay

MIN_EVERY_MS = 1000
"""Shortest interval: promoters look at schedules on a clock of seconds, as cron's sixth field does."""
COUNT_LIMIT = 1000
"""Most missed occurrences of a cron schedule counted, one by one (croniter steps about 70 us each, in the promoter's
thread, which must not stall); more are reported as this many, "at least". Intervals are counted exactly."""


def croniter_class() -> Any:
    try:
        from croniter import croniter
    except ImportError:  # pragma: no cover - depends on the installed extras
        raise ConfigurationError("cron schedules need croniter: pip install 'delay-broker[cron]'") from None
    return croniter


def zone_of(value: str | tzinfo) -> tzinfo:
    if isinstance(value, tzinfo):
        return value
    if not isinstance(value, str):
        raise ConfigurationError(f"timezone must be an IANA name or a tzinfo, got {value!r}")
    try:
        return ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError, OSError) as error:
        # ZoneInfo opens a file named after the zone: a directory ("America") or a name too long for the file
        # system fails there, not in the name check. Shown shortened, as a stored name may be any length.
        raise ConfigurationError(f"unknown time zone {_shortened(value)!r}") from error


def _shortened(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def instant_ms(label: str, value: datetime | None) -> int | None:
    """An aware datetime as epoch milliseconds (None stays None); :class:`ConfigurationError` otherwise."""
    if value is None:
        return None
    try:
        return due_to_ms(value)
    except InvalidDelay as error:
        raise ConfigurationError(f"{label}: {error}") from None


@dataclass(frozen=True)
class Timing:
    """``cron`` (5 fields, or 6 with seconds last) in ``timezone``, or ``every_ms``; never before
    ``start_ms`` nor after ``end_ms`` (epoch milliseconds, inclusive)."""

    cron: str | None = None
    every_ms: int | None = None
    timezone: tzinfo = timezone.utc
    start_ms: int | None = None
    end_ms: int | None = None

    FIELDS: ClassVar[tuple[str, ...]] = ("cron", "every_ms", "timezone", "start_ms", "end_ms")
    """What :meth:`from_fields` takes: a timing as stored."""

    @classmethod
    def create(
        cls,
        *,
        cron: str | None = None,
        every: float | timedelta | None = None,
        timezone: str | tzinfo = "UTC",
        start: datetime | None = None,
        end: datetime | None = None,
    ) -> Timing:
        """A validated timing; raises :class:`ConfigurationError` naming what is wrong."""
        every_ms = None
        if every is not None:
            try:
                every_ms = delay_to_ms(every)
            except InvalidDelay as error:
                raise ConfigurationError(f"every: {error}") from None
        return cls.from_fields(
            cron=cron,
            every_ms=every_ms,
            timezone=timezone,
            start_ms=instant_ms("start", start),
            end_ms=instant_ms("end", end),
        )

    @classmethod
    def from_fields(
        cls,
        *,
        cron: str | None,
        every_ms: int | None,
        timezone: str | tzinfo,
        start_ms: int | None,
        end_ms: int | None,
    ) -> Timing:
        """A validated timing from stored fields (milliseconds); raises :class:`ConfigurationError`."""
        if (cron is None) == (every_ms is None):
            raise ConfigurationError("a schedule needs either cron= or every=, not both and not neither")
        if every_ms is not None and (isinstance(every_ms, bool) or not isinstance(every_ms, int)):
            raise ConfigurationError(f"every must be a whole number of milliseconds, got {every_ms!r}")
        if every_ms is not None and every_ms < MIN_EVERY_MS:
            raise ConfigurationError(f"every must be at least {MIN_EVERY_MS // 1000} s, got {every_ms} ms")
        if cron is not None and (not isinstance(cron, str) or not croniter_class().is_valid(cron)):
            raise ConfigurationError(f"{cron!r} is not a valid cron expression")
        for label, value in (("start", start_ms), ("end", end_ms)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ConfigurationError(f"{label} must be epoch milliseconds, got {value!r}")
        if start_ms is not None and end_ms is not None and end_ms < start_ms:
            raise ConfigurationError(
                f"end ({ms_to_datetime(end_ms).isoformat()}) is before start ({ms_to_datetime(start_ms).isoformat()})"
            )
        timing = cls(cron, every_ms, zone_of(timezone), start_ms, end_ms)
        if cron is not None:
            try:
                # Valid syntax can still never fire ("0 0 31 2 *"): find out now, not at every look.
                timing.next_after(int(time.time() * 1000))
            except Exception as error:
                raise ConfigurationError(f"{cron!r} has no next occurrence ({error})") from None
        return timing

    @property
    def zone_name(self) -> str:
        """The time zone as stored: its IANA name (UTC for :data:`datetime.timezone.utc`)."""
        return str(getattr(self.timezone, "key", None) or self.timezone)

    def next_after(self, ms: int) -> int | None:
        """Due time (ms) of the first occurrence strictly after ``ms``; None once the schedule has ended."""
        if self.start_ms is not None and ms < self.start_ms:
            ms = self.start_ms - 1
        if self.every_ms is not None:
            anchor = self.start_ms or 0
            following = anchor if ms < anchor else anchor + ((ms - anchor) // self.every_ms + 1) * self.every_ms
        else:
            start = ms_to_datetime(ms).astimezone(self.timezone)
            found: datetime = croniter_class()(self.cron, start).get_next(datetime)
            following = math.ceil(found.timestamp() * 1000)
        return None if self.end_ms is not None and following > self.end_ms else following

    def count_between(self, after_ms: int, before_ms: int) -> int:
        """Occurrences strictly after ``after_ms`` and strictly before ``before_ms`` (of a cron expression, at
        most COUNT_LIMIT)."""
        if before_ms <= after_ms:
            return 0
        if self.every_ms is not None:
            first = self.next_after(after_ms)
            if first is None or first >= before_ms:
                return 0
            last = before_ms - 1 if self.end_ms is None else min(before_ms - 1, self.end_ms)
            return (last - first) // self.every_ms + 1
        count, cursor = 0, self.next_after(after_ms)
        while cursor is not None and cursor < before_ms and count < COUNT_LIMIT:
            count += 1
            cursor = self.next_after(cursor)
        return count

    def describe(self) -> str:
        """``cron 0 9 * * 1-5 (Europe/Paris)`` or ``every 3600 s``, with its dates when it has any."""
        text = (
            f"every {_seconds(self.every_ms)} s" if self.every_ms is not None else f"cron {self.cron} ({self.timezone})"
        )
        if self.start_ms is not None:
            text += f" from {ms_to_datetime(self.start_ms).isoformat()}"
        if self.end_ms is not None:
            text += f" until {ms_to_datetime(self.end_ms).isoformat()}"
        return text


def _seconds(ms: int) -> str:
    """Milliseconds as seconds, never in scientific notation (two weeks: 1209600, not 1.2096e+06)."""
    return str(ms // 1000) if ms % 1000 == 0 else f"{ms / 1000:.3f}".rstrip("0")
