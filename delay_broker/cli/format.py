"""The ``delay-broker`` command's records for ``--json`` and its bars (no click or rich in here).

Parsing and showing times, durations and filters is :mod:`delay_broker.display`'s, shared with the dashboard; its
names are importable from here too. Everything read from Redis is untrusted: payloads are decoded as JSON or text
only (never unpickled or evaluated).
"""

from __future__ import annotations

import base64
from typing import Any

from ..clock import iso_time as iso_time
from ..decoding import decode_payload
from ..display import (
    HISTOGRAM_KEYS,
    HISTOGRAM_LABELS,
    describe_filter,
    format_relative,
    format_span,
    format_time,
    histogram_rows,
    parse_duration,
    parse_iso,
    parse_when,
    printable,
)
from ..envelope import Envelope
from ..store import MessageInfo, StoreStats

# -- records for --json -------------------------------------------------------------------------------------------


def envelope_record(envelope: Envelope) -> dict[str, Any]:
    return {
        "framework": envelope.framework,
        "route": envelope.route,
        "name": envelope.name,
        "hash_field": envelope.hash_field,
        "parked_at_ms": envelope.parked_at_ms or None,
        "parked_at": iso_time(envelope.parked_at_ms or None),
        "extra": envelope.extra,
    }


def message_record(info: MessageInfo, *, with_payload: bool = False) -> dict[str, Any]:
    """A message as a JSON-ready dict (``with_payload``: the decoded payload and its base64 too)."""
    envelope = info.envelope
    record: dict[str, Any] = {
        "id": info.id,
        "state": info.state,
        "due_ms": info.due_ms,
        "due": iso_time(info.due_ms),
        "lease_deadline_ms": info.at_ms if info.state == "inflight" else None,
        "dead_lettered_at_ms": info.at_ms if info.state == "dead" else None,
        "attempts": info.attempts,
        "error": info.error,
        "framework": envelope.framework if envelope else None,
        "route": envelope.route if envelope else None,
        "name": envelope.name if envelope else None,
    }
    if with_payload:
        record["envelope"] = envelope_record(envelope) if envelope else None
        if envelope is not None:
            record["payload"] = decode_payload(envelope.framework, envelope.payload)
            record["payload_base64"] = base64.b64encode(envelope.payload).decode()
        else:
            record["corrupt_envelope"] = True
            record["raw_base64"] = base64.b64encode(info.raw or b"").decode()
    return record


def stats_record(stats: StoreStats, namespace: str) -> dict[str, Any]:
    return {
        "namespace": namespace,
        "now_ms": stats.now_ms,
        "now": iso_time(stats.now_ms),
        "parked": stats.parked,
        "far": stats.far,
        "packed": stats.packed,
        "inflight": stats.inflight,
        "dead": stats.dead,
        "overdue": stats.overdue,
        "oldest_overdue_age_ms": stats.oldest_overdue_age_ms,
        "next_due_ms": stats.next_due_ms,
        "next_due": iso_time(stats.next_due_ms),
        "live_promoters": stats.live_promoters,
        "shards": stats.shards,
        "counters": dict(sorted(stats.counters.items())),
        "histogram": {key: count for key, _, count in histogram_rows(stats)},
    }


def bar(count: int, largest: int, width: int = 40) -> str:
    """A bar of ``width`` cells at most, scaled to ``largest``; any non-zero count gets at least a sliver."""
    if count <= 0 or largest <= 0:
        return ""
    eighths = max(1, round(count / largest * width * 8))
    full, rest = divmod(eighths, 8)
    return "█" * full + ("", "▏", "▎", "▍", "▌", "▋", "▊", "▉")[rest]


__all__ = [
    "HISTOGRAM_KEYS",
    "HISTOGRAM_LABELS",
    "bar",
    "describe_filter",
    "envelope_record",
    "format_relative",
    "format_span",
    "format_time",
    "histogram_rows",
    "iso_time",
    "message_record",
    "parse_duration",
    "parse_iso",
    "parse_when",
    "printable",
    "stats_record",
]
