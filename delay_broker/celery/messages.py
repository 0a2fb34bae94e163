"""What we read from and keep of a Celery message: its due time, and the published message as opaque bytes.

We never decode task arguments: the body stays exactly as kombu serialized it. What is stored is JSON
written with kombu's own encoder (never pickle), and it is read back with ``kombu.utils.json.loads``.
"""

from __future__ import annotations

import base64
import dataclasses
import itertools
import logging
import pickletools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from celery.utils.time import maybe_iso8601, maybe_make_aware
from kombu.serialization import loads as _kombu_loads
from kombu.utils import json as _kombu_json

from ..envelope import Envelope
from ..errors import DelayBrokerError
from ..rescheduling import register
from ..store import DelayStore

FRAMEWORK = "celery"
"""The ``framework`` of the envelopes this adapter parks."""

# kombu's JSON codec (it round-trips datetimes, UUIDs and decimals with type tags; never pickle).
dumps: Callable[[Any], str] = _kombu_json.dumps
loads: Callable[[str | bytes], Any] = _kombu_json.loads
_decode: Callable[..., Any] = _kombu_loads

logger = logging.getLogger("delay_broker.celery")

CONTROL_METHODS = frozenset({"revoke"})
"""Pidbox broadcasts that cancel parked tasks where they are published (``revoke_by_stamped_headers`` cannot be mapped
to ids). Workers cancel them where they are received too (see :mod:`delay_broker.celery.control`)."""

_SAFE_CONTENT_TYPES = frozenset({"application/json", "application/x-msgpack", "application/x-yaml"})
"""Serializers a control broadcast may be decoded with: never pickle."""
PICKLE_CONTENT_TYPE = "application/x-python-serialize"


def parse_celery_time(value: object) -> datetime | None:
    """An ``eta``/``expires`` header as the worker reads it, or None if absent or unreadable.

    This calls the very functions Celery's worker uses (``Request.__init__``): an ISO string is parsed, and a
    *naive* value is taken as UTC (``maybe_make_aware(..., naive_as_utc=True)``). The instant does not
    depend on the app's timezone, which only changes how Celery displays it, so our due time is exactly
    the moment the worker would run the task.
    """
    if value is None or value == "":
        return None
    if isinstance(value, str):
        # Celery writes ``eta.isoformat()``: read by the standard library in a tenth of dateutil's time (every
        # delayed send pays it), and only when writing it back gives the very string (else dateutil reads it).
        try:
            fast = datetime.fromisoformat(value)
        except ValueError:
            fast = None
        if fast is not None and fast.isoformat() == value:
            return fast if fast.tzinfo is not None else fast.replace(tzinfo=timezone.utc)
    try:
        parsed = maybe_iso8601(value)
    except (AttributeError, ValueError, TypeError, OverflowError):
        return None
    if not isinstance(parsed, datetime):
        return None
    aware: datetime = maybe_make_aware(parsed, timezone.utc)
    return aware


@dataclass(frozen=True)
class TaskInfo:
    """The parts of a published task the adapter looks at."""

    id: str
    name: str | None
    eta: datetime | None
    expires: datetime | None
    retries: int = 0


def task_info(headers: Mapping[str, Any] | None) -> TaskInfo | None:
    """Read a protocol-2 task message's headers; None for anything else (events, control, protocol 1)."""
    if not headers:
        return None
    task_id, name = headers.get("id"), headers.get("task")
    if not isinstance(task_id, str) or not task_id or not isinstance(name, str):
        return None
    retries = headers.get("retries")
    return TaskInfo(
        task_id,
        name,
        parse_celery_time(headers.get("eta")),
        parse_celery_time(headers.get("expires")),
        retries if isinstance(retries, int) and not isinstance(retries, bool) else 0,
    )


# -- virtual transports (redis, SQS): the message dict that Channel._put receives --------------------------


def encode_virtual(message: Mapping[str, Any]) -> bytes:
    """Exactly what kombu's Redis ``_put`` would LPUSH: ``kombu.utils.json.dumps(message)``, as UTF-8."""
    return dumps(message).encode("utf-8")


def decode_virtual(payload: bytes) -> dict[str, Any]:
    """The message dict back; ValueError if it is not one kombu's virtual channels can deliver."""
    message = loads(payload)
    if not isinstance(message, dict):
        raise ValueError("stored message is not a JSON object")
    properties = message.get("properties")
    if not isinstance(properties, dict) or not isinstance(properties.get("delivery_info"), dict):
        raise ValueError("stored message has no properties.delivery_info")
    if "delivery_tag" not in properties or "body" not in message:
        raise ValueError("stored message has no body or delivery tag")
    return message


# -- pyamqp: amqp.Message plus exchange and routing key ------------------------------------------------------


def encode_amqp(body: bytes | str, properties: Mapping[str, Any], exchange: str, routing_key: str) -> bytes:
    """The message as sent on the wire (body bytes, AMQP properties) and where it was sent."""
    if isinstance(body, str):
        # amqp encodes a str body with the message's content_encoding before sending: keep those bytes.
        body = body.encode(str(properties.get("content_encoding") or "utf-8"))
    record = {
        "body": base64.b64encode(body).decode("ascii"),
        "properties": dict(properties),
        "exchange": exchange,
        "routing_key": routing_key,
    }
    return dumps(record).encode("utf-8")


@dataclass(frozen=True)
class AmqpRecord:
    body: bytes
    properties: dict[str, Any]
    exchange: str
    routing_key: str


def decode_amqp(payload: bytes) -> AmqpRecord:
    record = loads(payload)
    if not isinstance(record, dict):
        raise ValueError("stored message is not a JSON object")
    body, properties = record.get("body"), record.get("properties")
    exchange, routing_key = record.get("exchange"), record.get("routing_key")
    if not (isinstance(body, str) and isinstance(properties, dict)):
        raise ValueError("stored message has no body or properties")
    if not (isinstance(exchange, str) and isinstance(routing_key, str)):
        raise ValueError("stored message has no exchange or routing key")
    return AmqpRecord(base64.b64decode(body, validate=True), properties, exchange, routing_key)


def amqp_route(exchange: str, routing_key: str) -> str:
    """The route of an AMQP publish: the queue for the default exchange, else ``exchange:routing_key``."""
    return routing_key if not exchange else f"{exchange}:{routing_key}"


# -- control broadcasts (revoke) ------------------------------------------------------------------------------


def revoked_ids(body: object, content_type: str | None, content_encoding: str | None) -> list[str]:
    """Task ids named by a ``revoke`` pidbox broadcast (empty for any other control message)."""
    if content_type not in _SAFE_CONTENT_TYPES or body is None:
        if content_type == PICKLE_CONTENT_TYPE and _pickled_method(_as_bytes(body)) in CONTROL_METHODS:
            logger.warning(
                "delay_broker: a revoke broadcast is pickled (task_serializer='pickle'), which delay_broker never "
                "unpickles: the parked tasks it names are cancelled only when a worker running delay_broker receives "
                "it (workers decode it themselves). Else cancel them with delay_broker.celery.cancel(app, id), or use "
                "a json or msgpack task_serializer"
            )
        return []
    try:
        data = _decode(body, content_type, content_encoding or "utf-8", accept=_SAFE_CONTENT_TYPES)
    except Exception:  # a control message we cannot read is simply not ours to act on
        return []
    if not isinstance(data, dict) or data.get("method") not in CONTROL_METHODS:
        return []
    if data.get("destination") or data.get("pattern"):
        # Revoked on some workers only: the others would still run the task, so it stays parked.
        return []
    arguments = data.get("arguments") or {}
    ids = arguments.get("task_id") if isinstance(arguments, dict) else None
    if isinstance(ids, str):
        return [ids]
    if isinstance(ids, Iterable):
        return [item for item in ids if isinstance(item, str) and item]
    return []


def _as_bytes(body: object) -> bytes:
    if isinstance(body, str):
        return body.encode("utf-8", "replace")
    return bytes(body) if isinstance(body, bytes | bytearray | memoryview) else b""


def _pickled_method(body: bytes) -> str | None:
    """The ``method`` of a pickled control broadcast, read from its opcodes: pickletools only disassembles,
    nothing is unpickled."""
    strings: list[str] = []
    try:
        for _, argument, _ in pickletools.genops(body):
            if isinstance(argument, str):
                strings.append(argument)
    except Exception:  # not a pickle after all: nothing to say about it
        return None
    return next((value for key, value in itertools.pairwise(strings) if key == "method"), None)


def with_eta(envelope: Envelope, due: datetime) -> Envelope:
    """The parked task with its ``eta`` header set to ``due`` (body untouched). Whoever moves a parked task
    must move its eta too, or a task moved earlier would wait in a worker for its old eta."""
    record = loads(envelope.payload)
    eta = due.astimezone(timezone.utc).isoformat()
    if "exchange" in envelope.extra:  # pyamqp: {body, properties: {application_headers}, exchange, routing_key}
        record["properties"].setdefault("application_headers", {})["eta"] = eta
    else:  # virtual transports: kombu's message dict
        record["headers"]["eta"] = eta
    return dataclasses.replace(envelope, payload=dumps(record).encode("utf-8"))


REWRITE_ATTEMPTS = 5


def reschedule_parked(store: DelayStore, task_id: str, due: datetime) -> int | None:
    """Move a parked Celery task to ``due``, its eta header with it, in one step. Returns the new due time
    in ms, or None if the task is not parked."""
    for _ in range(REWRITE_ATTEMPTS):
        info = store.get(task_id)
        if info is None or info.state != "due" or info.envelope is None:
            return None
        # Only over the message read: a retry parked again under the task id meanwhile must not get the old
        # body. It is read again and moved in its turn.
        moved = store.reschedule(task_id, due=due, envelope=with_eta(info.envelope, due), expected=info)
        if moved is not None:
            return moved
    raise DelayBrokerError(f"task {task_id!r} kept being parked again while it was rescheduled: try again")


register(FRAMEWORK, reschedule_parked)  # the core's operations move Celery messages with it (see rescheduling)
