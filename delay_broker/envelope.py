"""The envelope: what the store keeps for each parked message.

An envelope is a small routing header followed by the framework's serialized message as opaque bytes. The
payload is never parsed here, and nothing read back from Redis is ever unpickled or evaluated.

Two record formats, told apart by the first byte; both are read, version 2 is written:

Version 2 (binary, first byte ``0x02``), integers big-endian::

    0x02 | flags u8 | parked-at u48 (ms, producer clock) | framework (u8 length + UTF-8) | route (u16 + UTF-8)
    [name (u16 + UTF-8)] [hash field: 16 bytes of a UUID, or u16 + UTF-8] [extras (u32 + JSON)] | payload

    flags: 1 name, 2 hash field, 4 hash field stored as a UUID's 16 bytes, 8 extras

A Dramatiq message's header takes 47 bytes this way, against about 100 as JSON. The canonical text of a UUID
hash field (Dramatiq's ``redis_message_id``) is stored as its 16 bytes and given back as the same text.

Version 1 (first byte ``{``): one line of JSON, then a newline, then the payload. Short names: ``v`` version,
``f`` framework ("dramatiq", "celery", "raw"), ``r`` route (the deliverer's name for the target queue), ``n``
display name (actor or task name), ``h`` hash field for targets that keep payloads in a hash, ``t`` parked at
(ms), ``x`` framework-specific routing extras. Stores written before version 2 keep working: their records are
read, listed and promoted as before.
"""

from __future__ import annotations

import functools
import json
import re
import struct
import uuid
from dataclasses import dataclass, field
from typing import Any

from .errors import CorruptEnvelope, InvalidMessage

VERSION = 2
"""The record format written; :meth:`Envelope.decode` reads it and version 1."""
_SEPARATOR = b"\n"
_V2 = 2
_NAME, _HASH_FIELD, _UUID_FIELD, _EXTRAS = 1, 2, 4, 8
_FIXED = struct.Struct(">BBHI")  # marker, flags, parked-at as 16 + 32 bits
_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@dataclass(frozen=True)
class Envelope:
    """A parked message: its payload and where it goes when due."""

    route: str
    payload: bytes
    framework: str = "raw"
    name: str | None = None
    hash_field: str | None = None
    parked_at_ms: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    version: int = field(default=0, compare=False)
    """The record format this envelope was read from (0: not read from a record). A store rewriting it (a Celery
    reschedule moves the payload's eta) writes no newer format: an old record stays readable by the promoters
    of the release that wrote it, during a rolling upgrade."""

    def encode(self, parked_at_ms: int = 0, version: int = VERSION) -> bytes:
        """The stored bytes; ``parked_at_ms`` stands in for an unset :attr:`parked_at_ms`. ``version=1`` writes
        the JSON header older releases read (for a rolling upgrade, until every reader runs version 2)."""
        parked_at = self.parked_at_ms or parked_at_ms
        if version == 1:
            return self._encode_v1(parked_at)
        if version != _V2:
            raise ValueError(f"envelope version must be 1 or 2, got {version!r}")
        if not 0 <= parked_at < 1 << 48:
            raise InvalidMessage(f"parked-at {parked_at} ms is out of range")
        flags, fields = _leading_fields(self.framework, self.route, self.name)
        parts = [fields]
        if self.hash_field is not None:
            flags |= _HASH_FIELD
            if _CANONICAL_UUID.fullmatch(self.hash_field):
                flags |= _UUID_FIELD
                parts.append(bytes.fromhex(self.hash_field.replace("-", "")))
            else:
                parts.append(_short(self.hash_field.encode(), "hash field"))
        if self.extra:
            flags |= _EXTRAS
            parts.append(_extras_field(self.extra))
        fixed = _FIXED.pack(_V2, flags, parked_at >> 32, parked_at & 0xFFFFFFFF)
        return b"".join((fixed, *parts, self.payload))

    def _encode_v1(self, parked_at: int) -> bytes:
        header: dict[str, Any] = {"v": 1, "f": self.framework, "r": self.route}
        if self.name is not None:
            header["n"] = self.name
        if self.hash_field is not None:
            header["h"] = self.hash_field
        if parked_at:
            header["t"] = parked_at
        if self.extra:
            header["x"] = self.extra
        line = json.dumps(header, separators=(",", ":"), ensure_ascii=True).encode("ascii")
        return line + _SEPARATOR + self.payload

    @classmethod
    def decode(cls, raw: bytes) -> Envelope:
        """Parse stored bytes; raises :class:`CorruptEnvelope` saying what is wrong."""
        if not isinstance(raw, bytes):
            raise CorruptEnvelope(f"envelope must be bytes, got {type(raw).__name__}")
        if raw[:1] == b"\x02":
            return _decode_v2(raw)
        return _decode_v1(raw)


def _extras_field(extra: dict[str, Any]) -> bytes:
    """The extras as a version 2 header holds them: length, then JSON."""
    if all(type(key) is str and type(value) is str for key, value in extra.items()):
        return _text_extras_field(tuple(extra.items()))  # a Celery task's queue: the same for every message
    return _encode_extras_field(extra)


@functools.lru_cache(maxsize=1024)
def _text_extras_field(items: tuple[tuple[str, str], ...]) -> bytes:
    return _encode_extras_field(dict(items))


def _encode_extras_field(extra: dict[str, Any]) -> bytes:
    extras = json.dumps(extra, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    return len(extras).to_bytes(4, "big") + extras


@functools.lru_cache(maxsize=1024)
def _leading_fields(framework: str, route: str, name: str | None) -> tuple[int, bytes]:
    """The flags and bytes of a version 2 header's framework, route and name: the same for every message of an
    actor, so each is encoded once."""
    fields = _short(framework.encode(), "framework", 0xFF) + _short(route.encode(), "route")
    if name is None:
        return 0, fields
    return _NAME, fields + _short(name.encode(), "name")


def _short(data: bytes, what: str, limit: int = 0xFFFF) -> bytes:
    if len(data) > limit:
        raise InvalidMessage(f"envelope {what} is {len(data)} bytes long, over the limit of {limit}")
    return len(data).to_bytes(1 if limit == 0xFF else 2, "big") + data


class _Reader:
    """Reads the fields of a version 2 header in order, refusing a record that ends inside one."""

    def __init__(self, raw: bytes) -> None:
        self.raw, self.at = raw, _FIXED.size

    def take(self, size: int, what: str) -> bytes:
        end = self.at + size
        if end > len(self.raw):
            raise CorruptEnvelope(f"malformed envelope: truncated header, in its {what}")
        data, self.at = self.raw[self.at : end], end
        return data

    def text(self, width: int, what: str) -> str:
        size = int.from_bytes(self.take(width, what), "big")
        try:
            return self.take(size, what).decode()
        except UnicodeDecodeError:
            raise CorruptEnvelope(f"malformed envelope: {what} is not UTF-8") from None


def _decode_v1(raw: bytes) -> Envelope:
    line, separator, payload = raw.partition(_SEPARATOR)
    if not separator:
        raise CorruptEnvelope("malformed envelope: no header line")
    header = _v1_header(line)
    route, name, hash_field = header.get("r"), header.get("n"), header.get("h")
    extra, parked_at = header.get("x", {}), header.get("t", 0)
    if not isinstance(route, str) or not route:
        raise CorruptEnvelope("malformed envelope: no route")
    if not isinstance(header.get("f"), str):
        raise CorruptEnvelope("malformed envelope: no framework")
    if name is not None and not isinstance(name, str):
        raise CorruptEnvelope("malformed envelope: name is not a string")
    if hash_field is not None and not isinstance(hash_field, str):
        raise CorruptEnvelope("malformed envelope: hash field is not a string")
    # Read as the scripts' cjson reads them, so that both promotion paths take the same records: an empty
    # array is an empty table there, and a number is an integer when its value is (1.0, 17e11).
    if extra == []:
        extra = {}
    if isinstance(parked_at, float) and parked_at.is_integer():
        parked_at = int(parked_at)
    if not isinstance(extra, dict):
        raise CorruptEnvelope("malformed envelope: extras are not an object")
    if isinstance(parked_at, bool) or not isinstance(parked_at, int):
        raise CorruptEnvelope("malformed envelope: parked-at is not an integer")
    return Envelope(
        route=route,
        payload=payload,
        framework=header["f"],
        name=name,
        hash_field=hash_field,
        parked_at_ms=parked_at,
        extra=extra,
        version=1,
    )


def _v1_header(line: bytes) -> dict[str, Any]:
    """A version 1 header line as the JSON object it must be, of version 1."""
    try:
        # Decoded as UTF-8 first: json.loads of bytes would also take UTF-16 or a byte-order mark, which
        # the scripts' reader refuses, and a record must read the same in Python and in Lua.
        header = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise CorruptEnvelope(f"malformed envelope: header is not JSON ({error})") from None
    except RecursionError:
        # A header nested thousands deep: it must be refused like any other, not break the caller's batch.
        raise CorruptEnvelope("malformed envelope: header is nested too deeply") from None
    if not isinstance(header, dict):
        raise CorruptEnvelope("malformed envelope: header is not a JSON object")
    version = header.get("v")
    if version != 1 or isinstance(version, bool):  # True == 1 in Python, not in JSON
        raise CorruptEnvelope(f"unsupported envelope version {version!r}")
    return header


def _decode_v2(raw: bytes) -> Envelope:
    if len(raw) < _FIXED.size:
        raise CorruptEnvelope("malformed envelope: truncated header")
    _, flags, high, low = _FIXED.unpack_from(raw)
    if flags & ~(_NAME | _HASH_FIELD | _UUID_FIELD | _EXTRAS):
        raise CorruptEnvelope(f"malformed envelope: unknown flags {flags:#04x}")
    reader = _Reader(raw)
    framework = reader.text(1, "framework")
    route = reader.text(2, "route")
    if not route:
        raise CorruptEnvelope("malformed envelope: no route")
    name = reader.text(2, "name") if flags & _NAME else None
    hash_field = None
    if flags & _HASH_FIELD:
        if flags & _UUID_FIELD:
            hash_field = str(uuid.UUID(bytes=reader.take(16, "hash field")))
        else:
            hash_field = reader.text(2, "hash field")
    extra: Any = {}
    if flags & _EXTRAS:
        text = reader.take(int.from_bytes(reader.take(4, "extras"), "big"), "extras")
        try:
            extra = json.loads(text.decode("utf-8"))  # UTF-8 only, as the scripts read it (see _v1_header)
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise CorruptEnvelope("malformed envelope: extras are not JSON") from None
        if not isinstance(extra, dict):
            raise CorruptEnvelope("malformed envelope: extras are not an object")
    return Envelope(
        route=route,
        payload=raw[reader.at :],
        framework=framework,
        name=name,
        hash_field=hash_field,
        parked_at_ms=high << 32 | low,
        extra=extra,
        version=_V2,
    )
