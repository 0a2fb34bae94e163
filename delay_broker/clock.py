"""Due times: validation of user-given delays and due times, and their encoding as sorted-set scores.

A score is ``due_ms * FIFO_SLOTS + (sequence mod FIFO_SLOTS)``: messages due in the same millisecond are
promoted in the order they were parked. Scores must stay below 2**53 to be exact as doubles, which bounds
due times to :data:`MAX_DUE_MS` (2248-09-26T15:10:22.207Z).
"""

from __future__ import annotations

import math
import numbers
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Literal

from .errors import InvalidDelay

FIFO_SLOTS = 1024
MAX_DUE_MS = 2**53 // FIFO_SLOTS - 1

Delay = float | int | timedelta

_NO_TIME = timedelta(0)
_MICROSECOND = timedelta(microseconds=1)
_MAX_DUE_UNITS = {"seconds": MAX_DUE_MS // 1000, "milliseconds": MAX_DUE_MS}

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_EARLIEST_SHOWN_MS = (datetime(1, 1, 2, tzinfo=timezone.utc) - _EPOCH) // timedelta(milliseconds=1)
_LATEST_SHOWN_MS = (datetime(9999, 12, 30, tzinfo=timezone.utc) - _EPOCH) // timedelta(milliseconds=1)


def delay_to_ms(delay: object, unit: Literal["seconds", "milliseconds"] = "seconds") -> int:
    """Turn a delay (a real number of ``unit``, or a timedelta) into whole milliseconds, rounded up (a delay is
    a minimum). Integers and timedeltas are converted exactly.

    Raises :class:`InvalidDelay` naming the problem for booleans, non-numbers, NaN, infinities, negative
    values and delays past :data:`MAX_DUE_MS`.
    """
    per_unit = 1000 if unit == "seconds" else 1
    if type(delay) is int and 0 <= delay <= _MAX_DUE_UNITS[unit]:  # the common case, first
        return delay * per_unit
    too_large = InvalidDelay("delay is too large: past the latest supported due time (2248-09-26T15:10:22Z)")
    if isinstance(delay, timedelta):
        if delay < _NO_TIME:  # checked before rounding up: -999 us would round to an accepted 0 ms
            raise InvalidDelay(f"delay must not be negative, got {delay}")
        millis = -(-(delay // _MICROSECOND) // 1000)
    elif isinstance(delay, bool) or not isinstance(delay, numbers.Real | Decimal):
        raise InvalidDelay(f"delay must be a number of {unit} or a timedelta, got {type(delay).__name__}")
    elif isinstance(delay, numbers.Integral):
        millis = int(delay) * per_unit
    else:
        try:
            value = float(delay)
        except OverflowError:
            raise too_large from None
        except ValueError:
            raise InvalidDelay(f"delay {delay!r} is not a usable number") from None
        if math.isnan(value):
            raise InvalidDelay("delay is NaN")
        if math.isinf(value):
            raise InvalidDelay("delay is infinite")
        if value < 0:
            raise InvalidDelay(f"delay must not be negative, got {value} {unit}")
        scaled = value * per_unit
        if scaled > MAX_DUE_MS:
            raise too_large
        millis = math.ceil(scaled)
    if millis < 0:
        raise InvalidDelay(f"delay must not be negative, got {millis} ms")
    if millis > MAX_DUE_MS:
        raise too_large
    return millis


def due_to_ms(due: datetime) -> int:
    """Turn an aware datetime into epoch milliseconds, rounded up.

    Naive datetimes are refused: the store cannot know which zone they mean. (The Celery adapter reads a
    naive ``eta`` in the app's timezone, as Celery does, before it gets here.)
    """
    if not isinstance(due, datetime):
        raise InvalidDelay(f"due must be a datetime, got {type(due).__name__}")
    if due.tzinfo is None or due.tzinfo.utcoffset(due) is None:
        raise InvalidDelay(f"due must be timezone-aware, got naive datetime {due.isoformat()}")
    # In whole microseconds: a float timestamp times 1000 can land just above an exact millisecond, which
    # rounding up then moved 1 ms later (an ISO time read back, as the dashboard's confirm page does, drifted).
    millis = -(-((due - _EPOCH) // timedelta(microseconds=1)) // 1000)
    if millis > MAX_DUE_MS:
        raise InvalidDelay(f"due time {due.isoformat()} is past the latest supported (2248-09-26T15:10:22Z)")
    return max(millis, 0)


def ms_to_datetime(millis: int) -> datetime:
    # A parked-at read back is the producer's clock, up to the year 10889 in the binary header: one past what a
    # datetime holds is shown at its edge (a day in, for time zones) rather than failing the whole listing.
    millis = min(max(millis, _EARLIEST_SHOWN_MS), _LATEST_SHOWN_MS)
    return _EPOCH + timedelta(milliseconds=millis)  # exact: millis / 1000 as a float can be a microsecond off


def iso_time(ms: int | None) -> str | None:
    """ISO 8601 with milliseconds and a ``Z`` (for JSON output), or None."""
    if ms is None:
        return None
    return ms_to_datetime(ms).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def due_of_score(score: float) -> int:
    # Scripts never write an infinite score, but one planted by hand (ZADD due -inf id) must not break every
    # claim and listing that meets it: it reads as due at the epoch (-inf) or at the latest due time (+inf).
    if not math.isfinite(score):
        return 0 if score < 0 else MAX_DUE_MS
    return int(score) // FIFO_SLOTS


def score_floor(due_ms: int) -> int:
    """Lowest score of messages due at ``due_ms``."""
    return due_ms * FIFO_SLOTS


def score_ceiling(due_ms: int) -> int:
    """Highest score of messages due at ``due_ms``."""
    return due_ms * FIFO_SLOTS + FIFO_SLOTS - 1
