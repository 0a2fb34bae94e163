"""Parked tasks as Celery's ``inspect scheduled`` reports the tasks a worker holds, for its reply and Flower's.

Celery answers ``scheduled`` with one entry per task in the worker's timer: ``{"eta", "priority", "request"}``,
``request`` being ``Request.info()`` (``id``, ``name``, ``args``, ``kwargs``, ``type``, ``hostname``,
``time_start``, ``acknowledged``, ``delivery_info``, ``worker_pid``); Flower's worker page shows ``request``'s
``name``, ``id``, ``args`` and ``kwargs``. A parked task gets the same shape, read from the stored message with
:mod:`delay_broker.decoding` (JSON only, never unpickled): ``args`` and ``kwargs`` decoded from a JSON body, else
(pickle, msgpack, yaml, or a body too large to repeat in a reply) the ``argsrepr``/``kwargsrepr`` the sender put
in the headers, as Celery's own ``safe`` listings show them. No worker holds it: ``hostname`` is None, and the
entry says ``"parked": True``.
"""

from __future__ import annotations

from datetime import timezone
from typing import Any

from ..clock import ms_to_datetime
from ..decoding import decode_payload
from ..store import MAX_BATCH, DelayStore, MessageInfo
from .messages import FRAMEWORK

BODY_SHOWN_BYTES = 4096
"""Bodies up to this size are decoded into the reply; a larger one is shown by its senders' reprs (which Celery
cuts at 1,024 characters): a reply of a thousand large tasks would otherwise weigh as much as the tasks."""

NOTE_ID = "delay_broker-note"
"""The ``request.id`` of an entry that is a note about the parked tasks (how many more there are), not a task."""


def parked_entries(store: DelayStore, limit: int) -> list[dict[str, Any]]:
    """The first ``limit`` parked Celery tasks, soonest due first, as ``scheduled`` entries; when more are parked,
    a last entry (:func:`more_entry`) says how many. ``limit=0`` gives that entry alone."""
    entries: list[dict[str, Any]] = []
    seen: set[str] = set()
    offset = 0
    while offset < limit:
        page = store.list_messages("due", offset=offset, count=min(MAX_BATCH, limit - offset))
        for info in page:
            entry = None if info.id in seen else scheduled_entry(info)
            if entry is not None:
                seen.add(info.id)
                entries.append(entry)
        offset += len(page)
        if len(page) < MAX_BATCH:
            break
    if offset >= limit:
        # The page was full (or nothing was to be listed): say how many more there are. Counted a moment after the
        # listing, so it is as of now, not exact to the task.
        more = store.stats().parked - offset
        if more > 0:
            entries.append(more_entry(more, limit))
    return entries


def scheduled_entry(info: MessageInfo) -> dict[str, Any] | None:
    """A parked task as a ``scheduled`` entry; None for a message that is not a Celery task's."""
    envelope = info.envelope
    if envelope is None or envelope.framework != FRAMEWORK or info.due_ms is None:
        return None
    decoded = decode_payload(FRAMEWORK, envelope.payload)
    message = decoded.get("message") if decoded["format"] == "json" else None
    fields = _message_fields(message if isinstance(message, dict) else {})
    headers = fields["headers"]
    task = _text(headers.get("task")) or envelope.name
    args, kwargs = _arguments(decoded.get("body"), headers)
    return {
        "eta": ms_to_datetime(info.due_ms).astimezone(timezone.utc).isoformat(),
        "priority": fields["priority"],
        "parked": True,
        "request": {
            "id": info.id,
            "name": _text(headers.get("shadow")) or task,
            "args": args,
            "kwargs": kwargs,
            "type": task,
            "hostname": None,
            "time_start": None,
            "acknowledged": False,
            "delivery_info": {
                "exchange": fields["exchange"],
                "routing_key": fields["routing_key"],
                "priority": fields["priority"],
                "redelivered": False,
            },
            "worker_pid": None,
        },
    }


def more_entry(more: int, limit: int) -> dict[str, Any]:
    """The entry that ends a listing cut at ``limit``: ``more`` parked tasks are not in it (its ``more`` field)."""
    text = f"delay_broker: {more:,} more parked task(s) not listed (inspect_limit {limit:,}); see delay-broker ls"
    return note_entry(text, more=more)


def note_entry(text: str, **fields: Any) -> dict[str, Any]:
    """An entry that says ``text`` about the parked tasks, shaped as a task's so that whatever reads the reply shows
    it (Flower's table shows ``request.name``), with the id :data:`NOTE_ID`, which no task has."""
    return {
        "eta": None,
        "priority": None,
        "parked": True,
        **fields,
        "request": {
            "id": NOTE_ID,
            "name": text,
            "args": [],
            "kwargs": {},
            "type": None,
            "hostname": None,
            "time_start": None,
            "acknowledged": False,
            "delivery_info": {},
            "worker_pid": None,
        },
    }


def _message_fields(message: dict[str, Any]) -> dict[str, Any]:
    """Headers, exchange, routing key and priority of a stored message: kombu's message dict (Redis, SQS) or an
    AMQP record (``{body, properties: {application_headers}, exchange, routing_key}``)."""
    properties = message.get("properties")
    properties = properties if isinstance(properties, dict) else {}
    if "exchange" in message and "routing_key" in message:
        headers = properties.get("application_headers")
        exchange, routing_key = message["exchange"], message["routing_key"]
    else:
        delivery = properties.get("delivery_info")
        delivery = delivery if isinstance(delivery, dict) else {}
        headers, exchange, routing_key = message.get("headers"), delivery.get("exchange"), delivery.get("routing_key")
    priority = properties.get("priority")
    return {
        "headers": headers if isinstance(headers, dict) else {},
        "exchange": exchange if isinstance(exchange, str) else None,
        "routing_key": routing_key if isinstance(routing_key, str) else None,
        "priority": priority if isinstance(priority, int) and not isinstance(priority, bool) else None,
    }


def _arguments(body: object, headers: dict[str, Any]) -> tuple[Any, Any]:
    """``args`` and ``kwargs``: decoded from a protocol-2 JSON body (``[args, kwargs, embed]``) small enough to
    repeat, else the reprs the sender wrote in the headers (what Celery shows when it does not decode)."""
    if isinstance(body, dict) and body.get("format") == "json" and int(body.get("size") or 0) <= BODY_SHOWN_BYTES:
        value = body.get("value")
        if isinstance(value, list) and len(value) >= 2 and isinstance(value[0], list) and isinstance(value[1], dict):
            return value[0], value[1]
    return _text(headers.get("argsrepr")) or "", _text(headers.get("kwargsrepr")) or ""


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None
