"""The envelope: what the store keeps for each parked message.

An envelope is one line of JSON (the header, a small versioned routing record) followed by a newline and
the framework's serialized message as opaque bytes. The payload is never parsed here, and nothing read back
from Redis is ever unpickled or evaluated.

Header fields (short names because every parked message carries them):

``v``  format version (1)          ``f``  framework ("dramatiq", "celery", "raw")
``r``  route: the deliverer's name for the target queue
``n``  display name (actor or task name), optional
``h``  hash field for targets that keep payloads in a hash (Dramatiq's ``redis_message_id``), optional
``t``  parked at (ms, producer clock)   ``x``  framework-specific routing extras, optional
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .errors import CorruptEnvelope

VERSION = 1
_SEPARATOR = b"\n"


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

    def encode(self, parked_at_ms: int = 0) -> bytes:
        """The stored bytes; ``parked_at_ms`` stands in for an unset :attr:`parked_at_ms`."""
        header: dict[str, Any] = {"v": VERSION, "f": self.framework, "r": self.route}
        if self.name is not None:
            header["n"] = self.name
        if self.hash_field is not None:
            header["h"] = self.hash_field
        parked_at = self.parked_at_ms or parked_at_ms
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
        line, separator, payload = raw.partition(_SEPARATOR)
        if not separator:
            raise CorruptEnvelope("malformed envelope: no header line")
        try:
            header = json.loads(line)
        except (UnicodeDecodeError, ValueError) as error:
            raise CorruptEnvelope(f"malformed envelope: header is not JSON ({error})") from None
        except RecursionError:
            # A header nested thousands deep: it must be refused like any other, not break the caller's batch.
            raise CorruptEnvelope("malformed envelope: header is nested too deeply") from None
        if not isinstance(header, dict):
            raise CorruptEnvelope("malformed envelope: header is not a JSON object")
        if header.get("v") != VERSION:
            raise CorruptEnvelope(f"unsupported envelope version {header.get('v')!r}")
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
        if not isinstance(extra, dict):
            raise CorruptEnvelope("malformed envelope: extras are not an object")
        if isinstance(parked_at, bool) or not isinstance(parked_at, int):
            raise CorruptEnvelope("malformed envelope: parked-at is not an integer")
        return cls(
            route=route,
            payload=payload,
            framework=header["f"],
            name=name,
            hash_field=hash_field,
            parked_at_ms=parked_at,
            extra=extra,
        )
