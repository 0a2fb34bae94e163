"""Times, durations, filters and buckets as people write and read them: for the command and the dashboard.

Click-free and rich-free, beside :mod:`delay_broker.decoding`: the dashboard reads the same ``5m`` / ``2030-01-31``
/ ``-1d`` a command line takes, and describes a filter in the same words. Everything read from Redis is untrusted:
every string meant for a terminal goes through :func:`printable` so that a crafted id or payload cannot send
escape sequences to the operator's terminal.
"""

from __future__ import annotations

import math
import re
import sys
from datetime import datetime, timezone

from .clock import MAX_DUE_MS, due_to_ms, ms_to_datetime
from .operations import MessageFilter
from .store import DelayStore, StoreStats

if sys.version_info >= (3, 11):
    _from_iso = datetime.fromisoformat
else:  # 3.10's fromisoformat reads only what isoformat() writes (no 20300101); dateutil reads ISO 8601 as 3.11 does
    from dateutil.parser import isoparse as _from_iso

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?", re.IGNORECASE)

HISTOGRAM_LABELS = ("overdue", "within 1 minute", "1 minute to 1 hour", "1 hour to 1 day", "later")
HISTOGRAM_KEYS = ("overdue", "next_minute", "next_hour", "next_day", "later")


# -- durations and times -----------------------------------------------------------------------------------


def parse_duration(text: str) -> float:
    """Seconds in ``text``: ``90``, ``90s``, ``5m``, ``2h``, ``3d``, ``1w``, ``250ms`` or sums like ``1h30m``.

    Raises ValueError with a message fit for a user.
    """
    cleaned = text.strip()
    if not cleaned:
        raise ValueError("empty duration")
    position, total = 0, 0.0
    while position < len(cleaned):
        match = _DURATION_PART.match(cleaned, position)
        if match is None:
            raise ValueError(f"cannot read duration {text!r}: use e.g. 30s, 5m, 2h, 3d, 1w or 1h30m")
        unit = (match.group(2) or "s").lower()
        total += float(match.group(1)) * _UNITS[unit]
        position = match.end()
        while position < len(cleaned) and cleaned[position] == " ":
            position += 1
    if not math.isfinite(total):
        raise ValueError(f"duration {text!r} is too large")
    return total


def parse_iso(text: str) -> datetime:
    """An ISO 8601 date or date-time; without a zone it is taken as UTC. Always returns an aware datetime."""
    cleaned = text.strip()
    if cleaned.endswith(("Z", "z")):
        cleaned = cleaned[:-1] + "+00:00"
    try:
        parsed: datetime = _from_iso(cleaned)
    except ValueError:
        raise ValueError(f"cannot read time {text!r}: use ISO 8601 like 2030-01-31T12:00:00Z") from None
    if parsed.tzinfo is None or parsed.tzinfo.utcoffset(parsed) is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed


def parse_when(text: str, now_ms: int) -> int:
    """A point in time, as epoch ms: ``now``, relative to ``now_ms`` (``5m``, ``+2h``, ``-1d``: in the past)
    or an ISO 8601 time (UTC unless it says otherwise)."""
    cleaned = text.strip()
    if cleaned.lower() == "now":
        return now_ms
    sign = 1
    body = cleaned
    if body[:1] in "+-" and body[1:2].isdigit():
        sign, body = (-1 if body[0] == "-" else 1), body[1:]
    # 2030-01-31 and its compact form 20300131 (as --at reads it) are dates, not a number of seconds.
    if body[:1].isdigit() and not re.match(r"\d{4}-\d{2}|\d{8}(?:T|$)", body):
        try:
            moment = now_ms + sign * round(parse_duration(body) * 1000)
        except ValueError:
            pass
        else:
            if not 0 <= moment <= MAX_DUE_MS:
                raise ValueError(f"time {text!r} is out of range: it must fall between 1970 and 2248")
            return moment
    return due_to_ms(parse_iso(cleaned))


def format_time(ms: int | None) -> str:
    """``2030-01-31 12:00:00.250Z`` (UTC), or ``-``."""
    if ms is None:
        return "-"
    moment = ms_to_datetime(ms)
    text = moment.strftime("%Y-%m-%d %H:%M:%S")
    if ms % 1000:
        text += f".{ms % 1000:03d}"
    return text + "Z"


def format_span(ms: int) -> str:
    """A duration for humans, rounded to what it shows: ``850ms``, ``42s``, ``5m 3s``, ``2h 10m``, ``3d 4h``."""
    ms = abs(int(ms))
    if ms < 1000:
        return f"{ms}ms"
    seconds = round(ms / 1000)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        minutes, seconds = divmod(seconds, 60)
        return f"{minutes}m {seconds}s" if seconds else f"{minutes}m"
    minutes = round(ms / 60_000)
    if minutes < 1440:
        hours, minutes = divmod(minutes, 60)
        return f"{hours}h {minutes}m" if minutes else f"{hours}h"
    days, hours = divmod(round(ms / 3_600_000), 24)
    return f"{days}d {hours}h" if hours else f"{days}d"


def format_relative(ms: int | None, now_ms: int) -> str:
    """``in 5m 3s``, ``3s ago`` or ``now`` (relative to the Redis clock's ``now_ms``)."""
    if ms is None:
        return "-"
    delta = ms - now_ms
    if abs(delta) < 1000:
        return "now"
    return f"in {format_span(delta)}" if delta > 0 else f"{format_span(delta)} ago"


# -- terminal safety -----------------------------------------------------------------------------------------


def printable(text: str, *, keep_newlines: bool = False) -> str:
    """``text`` with control and other non-printable characters escaped (``\\x1b``, ``\\u202e``)."""
    out = []
    for char in text:
        if char.isprintable() or (keep_newlines and char in "\n\t"):
            out.append(char)
        else:
            code = ord(char)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    return "".join(out)


# -- the due-time histogram and filters ------------------------------------------------------------------


def histogram_rows(stats: StoreStats) -> list[tuple[str, str, int]]:
    """``(key, label, count)`` per due-time bucket: overdue, then :attr:`DelayStore.HISTOGRAM_EDGES`, later."""
    counts = [stats.overdue, *stats.histogram]
    if len(counts) != len(HISTOGRAM_KEYS) or len(DelayStore.HISTOGRAM_EDGES) != 3:
        # The store's buckets changed: fall back to generic labels rather than mislabel them.
        return [(f"bucket_{n}", f"bucket {n}", count) for n, count in enumerate(counts)]
    return [(key, label, count) for key, label, count in zip(HISTOGRAM_KEYS, HISTOGRAM_LABELS, counts, strict=True)]


def describe_filter(filter: MessageFilter) -> str:
    """``queue 'emails', due until 2030-01-31 12:00:00Z``: what a filter selects, for confirmations (the CLI's
    and the dashboard's)."""
    parts = [
        f"{label} {printable(value)!r}"
        for label, value in (
            ("queue", filter.queue),
            ("task", filter.task),
            ("id prefix", filter.id_prefix),
            ("text", filter.text),
        )
        if value
    ]
    when = {"due": "due", "inflight": "lease until", "dead": "dead"}[filter.state]
    if filter.start_ms is not None:
        parts.append(f"{when} from {format_time(filter.start_ms)}")
    if filter.end_ms is not None:
        parts.append(f"{when} until {format_time(filter.end_ms)}")
    return ", ".join(parts) or "everything"
