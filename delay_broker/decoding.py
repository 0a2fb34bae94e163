"""What a stored payload holds, decoded as far as is safe: for the CLI, the dashboard and searches.

Payloads are Dramatiq messages (JSON), Celery messages as kombu published them (JSON, with a base64 and/or
JSON body), or anything else; they are decoded as JSON or text only, never unpickled or evaluated.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

PREVIEW_BYTES = 4096
"""Binary payloads are shown escaped up to this many bytes (JSON output also carries them in base64)."""

MAX_JSON_DEPTH = 200
"""JSON nested deeper is shown as the text it is: no real message nests so deep, and printed with indentation
each level indents all the levels below it, a size that grows with the square of the depth (5,000 levels took
a minute). Python 3.11's decoder stopped at its recursion limit anyway; 3.12's goes much deeper."""
_JSON_CONTENT_TYPES = ("application/json",)
_PICKLE_CONTENT_TYPES = ("application/x-python-serialize",)


def escape_bytes(data: bytes, limit: int = PREVIEW_BYTES) -> str:
    """Bytes as text with everything but printable ASCII escaped; cut at ``limit`` bytes with a marker."""
    shown = data[:limit]
    text = "".join(chr(b) if 0x20 <= b < 0x7F or b in (0x0A,) else f"\\x{b:02x}" for b in shown)
    if len(data) > limit:
        text += f"... ({len(data) - limit} more bytes)"
    return text


def decode_payload(framework: str, payload: bytes) -> dict[str, Any]:
    """What a payload holds, decoded as far as is safe.

    Returns ``{"format": "json", "message": ...}`` for JSON (Dramatiq messages; Celery messages as kombu
    published them, with ``"body"`` decoded next to them when it is base64 and/or JSON), ``{"format":
    "text", "text": ...}`` for other UTF-8, or ``{"format": "binary", "escaped": ..., "base64": ...}``.
    Nothing is ever unpickled or evaluated.
    """
    result: dict[str, Any] = {"size": len(payload)}
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        result.update(format="binary", escaped=escape_bytes(payload), base64=base64.b64encode(payload).decode())
        return result
    try:
        message = loads_shallow(text)
    except (ValueError, RecursionError):  # nested thousands deep: shown as the text it is
        result.update(format="text", text=text)
        return result
    result.update(format="json", message=message)
    if framework == "celery" and isinstance(message, dict) and isinstance(message.get("body"), str):
        result["body"] = decode_celery_body(message)
    return result


def decode_celery_body(message: dict[str, Any]) -> dict[str, Any]:
    """Decode the ``body`` of a stored Celery message (kombu virtual-transport dict or AMQP record).

    The body is base64 when ``properties.body_encoding`` says so (Redis and SQS transports) and always for
    AMQP records (which carry ``exchange`` and ``routing_key``). JSON bodies are parsed (protocol 2 tasks:
    ``[args, kwargs, embed]``); pickled bodies are left alone.
    """
    body: str = message["body"]
    properties = message.get("properties") if isinstance(message.get("properties"), dict) else {}
    assert isinstance(properties, dict)
    is_amqp_record = "exchange" in message and "routing_key" in message
    content_type = message.get("content-type") or properties.get("content_type")
    content_encoding = message.get("content-encoding") or properties.get("content_encoding") or "utf-8"
    raw: bytes
    if is_amqp_record or properties.get("body_encoding") == "base64":
        try:
            raw = base64.b64decode(body, validate=True)
        except (binascii.Error, ValueError):
            return {"format": "text", "content_type": content_type, "text": body, "note": "body is not valid base64"}
    else:
        raw = body.encode("utf-8")
    described: dict[str, Any] = {"content_type": content_type, "size": len(raw)}
    if isinstance(content_type, str) and content_type in _PICKLE_CONTENT_TYPES:
        described.update(format="binary", escaped=escape_bytes(raw), note="pickled body: not decoded")
        return described
    try:
        decoded = raw.decode(str(content_encoding))
    except (LookupError, UnicodeDecodeError):
        described.update(format="binary", escaped=escape_bytes(raw))
        return described
    if content_type in _JSON_CONTENT_TYPES or content_type is None:
        try:
            described.update(format="json", value=loads_shallow(decoded))
            return described
        except (ValueError, RecursionError):
            pass
    described.update(format="text", text=decoded)
    return described


def loads_shallow(text: str) -> Any:
    """``json.loads``, raising ValueError for JSON nested deeper than :data:`MAX_JSON_DEPTH`."""
    value = json.loads(text)
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if depth > MAX_JSON_DEPTH:
            raise ValueError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
        if isinstance(item, dict):
            pending.extend((child, depth + 1) for child in item.values() if isinstance(child, dict | list))
        elif isinstance(item, list):
            pending.extend((child, depth + 1) for child in item if isinstance(child, dict | list))
    return value


def searchable_text(framework: str, payload: bytes) -> str:
    """The text a search looks in: the payload as stored, the strings of a JSON payload as they read (JSON
    escapes undone: a Dramatiq argument ``"Zürich"`` is stored as ``"Z\\u00fcrich"``), and for Celery those of
    its decoded body (arguments). Parts are joined by a unit separator, which no search text holds."""
    decoded = decode_payload(framework, payload)
    parts = [payload.decode("utf-8", errors="replace")]
    if decoded["format"] == "json":
        parts.extend(_strings(decoded["message"]))
    body = decoded.get("body")
    if isinstance(body, dict):
        value = body.get("value", body.get("text"))
        if value is not None:
            parts.append(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False))
            parts.extend(_strings(value))
    return "\x1f".join(parts)


def _strings(value: Any) -> list[str]:
    """Every string (keys too) in a decoded JSON value, depth first, without recursion (JSON may nest deep)."""
    found: list[str] = []
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            found.append(item)
        elif isinstance(item, dict):
            found.extend(key for key in item if isinstance(key, str))
            pending.extend(reversed(list(item.values())))
        elif isinstance(item, list):
            pending.extend(reversed(item))
    return found
