"""What the dashboard's templates show: filters read from query strings and forms, messages as rows."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from ..clock import iso_time, ms_to_datetime
from ..display import histogram_rows, parse_when
from ..operations import MessageFilter
from ..store import ListState, MessageInfo, StoreStats

FILTER_FIELDS = ("state", "queue", "task", "id_prefix", "text", "from", "to")

SHORT_LABELS = {"next_minute": "< 1 min", "next_hour": "1 min-1 h", "next_day": "1 h-1 day"}
"""Chart labels of the due-time buckets (see :func:`delay_broker.display.histogram_rows`)."""

LATENESS_LABELS = {"10": "< 10 ms", "100": "10-100 ms", "1000": "0.1-1 s", "10000": "1-10 s", "60000": "10 s-1 min"}
"""Chart labels of the store's promotion-lateness buckets (upper edges in ms; 'more' is over a minute)."""


def format_time(ms: int | None) -> str:
    if ms is None:
        return "-"
    return ms_to_datetime(ms).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def format_age(ms: int | None) -> str:
    if not ms:
        return "0 s"
    seconds = ms / 1000
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.1f} s"


def pretty_json(value: Any) -> str:
    """JSON for a <pre> block, as the data says it (the template escapes it; no \\u003c as ``tojson`` writes)."""
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def lateness_bars(buckets: list[tuple[str, int]]) -> list[tuple[str, int]]:
    return [(LATENESS_LABELS.get(bucket, "> 1 min"), count) for bucket, count in buckets]


def histogram_bars(stats: StoreStats) -> list[tuple[str, int]]:
    """Parked messages per due-time bucket: overdue, within a minute, an hour, a day, later."""
    return [(SHORT_LABELS.get(key, key), count) for key, _, count in histogram_rows(stats)]


def filter_from(params: Mapping[str, Any], now_ms: int) -> MessageFilter:
    """A filter from a query string or form (the names of :data:`FILTER_FIELDS`); ValueError when malformed.
    Times are ISO 8601 (UTC unless they say otherwise), ``now``, or relative to now (``-1h``, ``30m``).
    Names, id prefix and text are taken as given, spaces and all, as the CLI and the operations layer take them:
    the same filter lists the same messages everywhere. An empty field filters on nothing."""
    state: ListState = params.get("state") or "due"
    if state not in ("due", "inflight", "dead"):
        raise ValueError(f"unknown state {state!r}")

    def text(name: str) -> str | None:
        value = params.get(name)
        return (value or None) if isinstance(value, str) else None

    def when(name: str) -> int | None:
        value = text(name)
        if value is None or not value.strip():
            return None
        try:
            return parse_when(value, now_ms)
        except ValueError as error:
            raise ValueError(f"{name}: {error}") from None

    return MessageFilter(state, when("from"), when("to"), text("queue"), text("task"), text("id_prefix"), text("text"))


def filter_fields(filter: MessageFilter) -> dict[str, str]:
    """The fields of a filter as :func:`filter_from` reads them back to the same filter: its window as the
    instants it meant when it was read (ISO, to the millisecond), not as ``-1h`` to be read against a later now."""
    fields = {
        "state": filter.state,
        "queue": filter.queue,
        "task": filter.task,
        "id_prefix": filter.id_prefix,
        "text": filter.text,
        "from": iso_time(filter.start_ms),
        "to": iso_time(filter.end_ms),
    }
    return {key: value for key, value in fields.items() if value}


def filter_query(filter: MessageFilter | None) -> str:
    """The query string of a filter (see :func:`filter_fields`)."""
    return "" if filter is None else urlencode(filter_fields(filter))


def message_view(info: MessageInfo) -> dict[str, Any]:
    """A message as a list row or a detail page shows it (every string is escaped by the templates)."""
    envelope = info.envelope
    return {
        "id": info.id,
        "state": info.state,
        "due_ms": info.due_ms,
        "at_ms": info.at_ms,
        "attempts": info.attempts,
        "error": info.error,
        "framework": envelope.framework if envelope else "(corrupt envelope)",
        "queue": envelope.route if envelope else None,
        "name": envelope.name if envelope else None,
    }
